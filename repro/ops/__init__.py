"""Operations: what runs the research code and measures it, kept apart from it (the research core is the rest of
`repro/`: data, tokenisation, attention, memory, training, metrics, tables).

- `mirror`: a loopback mirror of the papers' sources in their real formats, for the rehearsal and the download
  tests (the downloads themselves are the data layer's, `repro.data.download`);
- `bench`: speed, model-FLOPs utilisation and memory of a config's model (`repro bench`); `sidebyside`: the papers'
  models against the authors' code, in turns (`repro bench-*-authors`); `timing`: the clock, precision and FLOP
  count both use; `memtrack`: the peak of the tensors a forward pass creates; `rss`: a process's peak resident
  memory;
- `allocator`: the memory-allocator policy of `repro` processes.

The command line (`repro.cli`) drives both; nothing in the research core imports this package.
"""
