"""What runs inside the training process: patch and record -> store -> watchdog."""
