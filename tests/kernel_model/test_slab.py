"""Tests for kernel_model/slab.py: use-after-free, double free and leaks of kernel objects."""

from __future__ import annotations

import pytest

from kernel_model.emu.leakcheck import find_leaks
from kernel_model.errno import KernelBug
from kernel_model.kthread import kthread_run
from kernel_model.slab import DoubleFree, UseAfterFree, kfree, kmalloc_obj, kmem_is_freed

HERE = "tests/kernel_model/test_slab.py"


class mlx5_ib_mr:
    def __init__(self, lkey: int):
        self.lkey = lkey

    def __repr__(self) -> str:
        return f"MR lkey={self.lkey:#x}"

    def revoke(self) -> None:
        self.lkey = 0


def test_a_correct_lifetime_passes(m):
    with m.kernel():
        mr = kmalloc_obj(mlx5_ib_mr(0x100))
        mr.revoke()
        assert mr.lkey == 0 and not kmem_is_freed(mr)
        kfree(mr)
        kfree(None)   # a no-op, as in the kernel
        assert kmem_is_freed(mr)
    assert find_leaks(m) == []


def test_use_after_free_names_object_freer_and_access(m):
    with m.kernel():
        mr = kmalloc_obj(mlx5_ib_mr(0x100))

        def freer():
            kfree(mr)

        kthread_run(freer, name="reaper").join()
        with pytest.raises(UseAfterFree) as ei:
            _ = mr.lkey
    msg = str(ei.value)
    assert msg.startswith(f"BUG: KASAN: slab-use-after-free: read of .lkey by main at {HERE}:")
    assert msg.endswith(f" of mlx5_ib_mr object MR lkey=0x100, freed by reaper-1 at {HERE}:"
                        f"{freer.__code__.co_firstlineno + 1} freer()")


def test_every_kind_of_access_is_caught(m):
    with m.kernel():
        mr = kmalloc_obj(mlx5_ib_mr(7))
        kfree(mr)
        with pytest.raises(UseAfterFree, match="write of .lkey"):
            mr.lkey = 1
        with pytest.raises(UseAfterFree, match="delete of .lkey"):
            del mr.lkey
        with pytest.raises(UseAfterFree, match="read of .revoke"):
            mr.revoke()
        # not uses of the object: the emulator's repr and isinstance
        assert repr(mr) == "<freed MR lkey=0x7>"
        assert isinstance(mr, mlx5_ib_mr) and not isinstance(mr, int)
        assert type(mr).__name__ == "freed_mlx5_ib_mr"


def test_double_free_names_both_free_sites(m):
    with m.kernel():
        mr = kmalloc_obj(mlx5_ib_mr(1))
        kfree(mr)
        with pytest.raises(DoubleFree, match=f"BUG: KASAN: double-free: kfree of mlx5_ib_mr "
                           f"object MR lkey=0x1 by main at {HERE}:.* already freed by main at "
                           f"{HERE}:"):
            kfree(mr)


def test_freeing_what_was_never_allocated_is_a_bug(m):
    with m.kernel(), pytest.raises(KernelBug, match="invalid-free: kfree of mlx5_ib_mr object "
                                   "MR lkey=0x2 by main at .* which kmalloc_obj never allocated"):
        kfree(mlx5_ib_mr(2))


def test_a_leaked_object_is_reported_with_its_allocation_site(m):
    with m.kernel():
        mr = kmalloc_obj(mlx5_ib_mr(3))
        line = test_a_leaked_object_is_reported_with_its_allocation_site.__code__.co_firstlineno
    assert find_leaks(m) == [f"object mlx5_ib_mr MR lkey=0x3 allocated at {HERE}:{line + 2} "
                             "test_a_leaked_object_is_reported_with_its_allocation_site() by "
                             "main never freed"]
    with m.kernel():
        kfree(mr)
    assert find_leaks(m) == []


def test_poison_classes_are_made_once_per_class(m):
    with m.kernel():
        a, b = kmalloc_obj(mlx5_ib_mr(1)), kmalloc_obj(mlx5_ib_mr(2))
        kfree(a)
        kfree(b)
        assert type(a) is type(b)
        with pytest.raises(KernelBug, match="kmalloc_obj: mlx5_ib_mr object MR lkey=0x1 was "
                           f"freed by main at {HERE}:"):
            kmalloc_obj(a)
        c = kmalloc_obj(mlx5_ib_mr(3))
        with pytest.raises(KernelBug, match="kmalloc_obj: mlx5_ib_mr object MR lkey=0x3 is "
                           f"already allocated, at {HERE}:"):
            kmalloc_obj(c)
        kfree(c)


class named_client:
    TRACE_NAME_OUTLIVES_FREE = True

    def __init__(self, name: str):
        self.name = name

    @property
    def trace_name(self) -> str:
        return self.name


class named_umem(named_client):
    TRACE_NAME_OUTLIVES_FREE = False


def test_a_trace_names_a_freed_object_by_type_unless_its_class_keeps_the_name(m):
    from kernel_model.trace import summarise
    with m.kernel():
        c, u = kmalloc_obj(named_client("nv_mem")), kmalloc_obj(named_umem("umem 0x0"))
        assert (summarise(c), summarise(u)) == ("nv_mem", "umem 0x0")
        kfree(c)
        kfree(u)
    assert (summarise(c), summarise(u)) == ("nv_mem", "named_umem")
    with pytest.raises(UseAfterFree):
        _ = c.name
