"""The rows processing keeps besides tokens: dead letters and aggregation states."""
