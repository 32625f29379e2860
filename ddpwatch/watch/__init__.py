"""On the watchdog thread: the store protocol, peers, verdicts, incidents and abort; reads what capture recorded."""
