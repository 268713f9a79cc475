"""PageStack: the pops' order, and pop_scrubbed's zeroing of reused pages only."""

from kernel_model.hw.page_stack import PageStack

SHIFT = 4                       # 16-byte "pages" keep the buffer small


def test_pops_hand_back_first_then_the_lowest_never_handed_out():
    s = PageStack(8)
    assert [s.pop() for _ in range(3)] == [0, 1, 2]
    s.extend([1, 0])
    assert len(s) == 7
    assert [s.pop() for _ in range(4)] == [0, 1, 3, 4]


def test_pop_scrubbed_zeroes_reused_pages_and_leaves_fresh_ones():
    """A page handed out before is zeroed when handed out again; one never handed out
    is not written (the memory starts zeroed) - 0xFF marks what was not written."""
    mem = bytearray(b"\xff" * (8 << SHIFT))
    view = memoryview(mem)
    s = PageStack(8)
    assert s.pop_scrubbed(2, view, SHIFT) == [0, 1]
    assert mem == b"\xff" * (8 << SHIFT)           # fresh: nothing written
    s.extend([1])
    assert s.pop_scrubbed(2, view, SHIFT) == [1, 2]  # 1 again, then fresh 2
    assert mem[1 << SHIFT:2 << SHIFT] == bytes(1 << SHIFT)
    assert mem[:1 << SHIFT] == b"\xff" * (1 << SHIFT)
    assert mem[2 << SHIFT:] == b"\xff" * (6 << SHIFT)
