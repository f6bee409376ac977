"""Every word a task prompt or answer can contain; the tokenizer is built from these lists.

Items are lower-case first names, one token each (ParallelBench uses "First Last" pairs; one token
per item keeps a ~2M-parameter model's job to the list operation itself). Latin-square symbols are
upper-case letters and digits, as ParallelBench draws them from A-Z plus 0-9.
"""

NAMES: tuple[str, ...] = (
    "alice", "amber", "andrew", "anna", "arthur", "bella", "ben", "bob", "carl", "carol",
    "chloe", "colin", "daisy", "dan", "david", "diana", "edgar", "ella", "emma", "eric",
    "fiona", "frank", "gavin", "grace", "hank", "hazel", "helen", "henry", "ian", "iris",
    "ivan", "jack", "jade", "james", "jane", "kate", "kevin", "kyle", "laura", "leo",
    "lily", "lucy", "luke", "maria", "mark", "mia", "nancy", "nick", "nina", "oliver",
    "olivia", "oscar", "paul", "peter", "quinn", "rachel", "rose", "ruby", "sam", "sarah",
    "tina", "tom", "victor", "wendy",
)
"""64 distinct item names, sorted, so alphabetical order is the tuple order."""

SYMBOLS: tuple[str, ...] = tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ") + tuple("0123456789")
"""Latin-square symbol pool (36 symbols, as ParallelBench)."""

MAX_INDEX = 16
NUMBERS: tuple[str, ...] = tuple(str(i) for i in range(MAX_INDEX + 1))
"""Index words for the *_index tasks and Sudoku digits ("0" marks a blank)."""

INSTRUCTIONS: tuple[str, ...] = (
    "copy", "sort", "reverse", "shuffle", "insert", "remove", "replace", "at", "with",
    "latin", "sudoku", ":",
)
"""Instruction words; `:` separates the instruction from the input list."""

assert len(set(NAMES)) == len(NAMES) and list(NAMES) == sorted(NAMES)
assert not set(NAMES) & set(INSTRUCTIONS)
