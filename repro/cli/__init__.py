"""The command layer of `repro`, above the library it calls: the entry point (`entry`), the Lightning CLI (`cli`),
the shared commands (`commands`, `bench`, `context`, `generate`), `runs`, `rehearsal`, and the registry of the
papers' own commands (`registry`). Nothing below this package imports it; importing it imports nothing."""
