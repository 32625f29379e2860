"""Reading what ddpwatch and torch wrote: report.json and rank files, Flight Recorder dumps; `ddpwatch report`."""
