"""The memory arena: every memory mechanism of the four papers, and their compositions, on one backbone at equal
compute."""
