"""MMA instruction records (data) and the cost-aware selector."""
