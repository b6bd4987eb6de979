from repro.runs import entry

entry()
