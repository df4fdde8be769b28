"""What a run reports: metrics to JSONL and TensorBoard (`metrics`), the trackers users expect
(`trackers`), the live panel and log line (`progress`, over `step_window`'s rates), and the
summary and plots at the end (`report`)."""
