"""Tests for userspace/providers/mlx5/env.py: the libmlx5 environment knobs."""

from __future__ import annotations

import errno

import attrs
import pytest

from userspace.providers.mlx5.env import (
    _atoi,
    get_always_bf,
    get_num_low_lat_uuars,
    get_shut_up_bf,
    get_total_uuars,
    get_uar_info,
    need_uuar_lock,
    qp_sig_enabled,
    single_threaded_app,
    srq_sig_enabled,
    use_scatter_to_cqe,
)
from userspace.providers.mlx5.errors import ProviderError

P4K, P64K = 4096, 65536


@attrs.define
class Ctx:
    tot_uuars: int = 16
    low_lat_uuars: int = 4
    single_threaded: bool = False


# -- kernel_facts §13 "rdma-core env" -------------------------------------------------

def test_defaults_are_16_and_4() -> None:
    assert get_uar_info({}, P4K) == (16, 4)


def test_total_20_raises_low_latency_to_8() -> None:
    assert get_uar_info({"MLX5_TOTAL_UUARS": "20"}, P4K) == (20, 8)


def test_total_3_rounds_up_to_a_whole_uar() -> None:
    assert get_total_uuars({"MLX5_TOTAL_UUARS": "3"}, P4K) == 4


def test_64k_pages_ask_for_a_whole_system_page() -> None:
    assert get_total_uuars({}, P64K) == 32
    assert get_uar_info({}, P64K) == (32, 20)      # 32 - 12 medium


def test_total_0_is_einval() -> None:
    with pytest.raises(ProviderError) as e:
        get_total_uuars({"MLX5_TOTAL_UUARS": "0"}, P4K)
    assert e.value.errno == errno.EINVAL
    assert e.value.function == "get_total_uuars"


def test_total_600_is_enomem() -> None:
    with pytest.raises(ProviderError) as e:
        get_uar_info({"MLX5_TOTAL_UUARS": "600"}, P4K)
    assert e.value.errno == errno.ENOMEM
    assert e.value.function == "get_total_uuars"


def test_all_low_latency_is_enomem() -> None:
    env = {"MLX5_NUM_LOW_LAT_UUARS": "16"}
    assert get_num_low_lat_uuars(env, 16) == 16     # the check is the caller's
    with pytest.raises(ProviderError) as e:
        get_uar_info(env, P4K)
    assert e.value.errno == errno.ENOMEM
    assert e.value.function == "get_uar_info"


def test_low_latency_15_of_16_is_accepted() -> None:
    assert get_uar_info({"MLX5_NUM_LOW_LAT_UUARS": "15"}, P4K) == (16, 15)


def test_negative_low_latency_is_einval() -> None:
    with pytest.raises(ProviderError) as e:
        get_uar_info({"MLX5_NUM_LOW_LAT_UUARS": "-1"}, P4K)
    assert e.value.errno == errno.EINVAL
    assert e.value.function == "get_num_low_lat_uuars"


def test_512_is_the_largest_total() -> None:
    assert get_total_uuars({"MLX5_TOTAL_UUARS": "511"}, P4K) == 512
    with pytest.raises(ProviderError):
        get_total_uuars({"MLX5_TOTAL_UUARS": "513"}, P4K)


@pytest.mark.parametrize("text,value", [
    ("12", 12), ("  7", 7), ("+5", 5), ("-3", -3), ("12abc", 12), ("abc", 0), ("", 0),
    ("4294967312", 16),             # (int) truncation of the long: 2**32 + 16
    ("99999999999999999999", -1),   # strtol clamps to LONG_MAX, (int) gives -1
])
def test_atoi_is_c_atoi(text: str, value: int) -> None:
    assert _atoi(text) == value


def test_garbage_total_reads_as_zero_and_fails() -> None:
    with pytest.raises(ProviderError) as e:
        get_total_uuars({"MLX5_TOTAL_UUARS": "lots"}, P4K)
    assert e.value.errno == errno.EINVAL


# -- the boolean knobs ---------------------------------------------------------------

@pytest.mark.parametrize("env,expect", [({}, False), ({"MLX5_SINGLE_THREADED": "1"}, True),
                                        ({"MLX5_SINGLE_THREADED": "yes"}, False),
                                        ({"MLX5_SINGLE_THREADED": "0"}, False)])
def test_single_threaded_needs_exactly_1(env: dict, expect: bool) -> None:
    assert single_threaded_app(env) is expect


@pytest.mark.parametrize("env,expect", [({}, False), ({"MLX5_SHUT_UP_BF": "1"}, True),
                                        ({"MLX5_SHUT_UP_BF": "0"}, False),
                                        ({"MLX5_SHUT_UP_BF": ""}, True)])
def test_shut_up_bf_is_anything_but_0(env: dict, expect: bool) -> None:
    assert get_shut_up_bf(env) is expect


@pytest.mark.parametrize("env,expect", [({}, True), ({"MLX5_POST_SEND_PREFER_BF": "0"}, False),
                                        ({"MLX5_POST_SEND_PREFER_BF": "1"}, True)])
def test_prefer_bf_defaults_on(env: dict, expect: bool) -> None:
    assert get_always_bf(env) is expect


@pytest.mark.parametrize("env,expect", [({}, False), ({"MLX5_QP_SIGNATURE": "0"}, True),
                                        ({"MLX5_QP_SIGNATURE": ""}, True)])
def test_qp_signature_is_set_or_not(env: dict, expect: bool) -> None:
    assert qp_sig_enabled(env) is expect


def test_srq_signature_is_set_or_not() -> None:
    assert srq_sig_enabled({"MLX5_SRQ_SIGNATURE": "0"}) and not srq_sig_enabled({})


@pytest.mark.parametrize("env,expect", [({}, True), ({"MLX5_SCATTER_TO_CQE": "0"}, False),
                                        ({"MLX5_SCATTER_TO_CQE": "no"}, True)])
def test_scatter_to_cqe_off_only_for_0(env: dict, expect: bool) -> None:
    assert use_scatter_to_cqe(env) is expect


# -- need_uuar_lock ------------------------------------------------------------------

def test_uuar_0_never_locks() -> None:
    assert not need_uuar_lock(Ctx(), 0)


@pytest.mark.parametrize("uuarn", [24, 25, 28, 29])
def test_low_latency_registers_are_lock_free(uuarn: int) -> None:
    # kernel bfregs 12..15 of 16/4 (adjusted to the 4-per-UAR numbering)
    assert not need_uuar_lock(Ctx(), uuarn)


@pytest.mark.parametrize("uuarn", [1, 4, 5, 8, 9, 20, 21])
def test_medium_registers_need_the_lock(uuarn: int) -> None:
    # kernel bfregs 1..11
    assert need_uuar_lock(Ctx(), uuarn)


def test_single_threaded_turns_every_lock_off() -> None:
    ctx = Ctx(single_threaded=True)
    assert not any(need_uuar_lock(ctx, n) for n in range(32))


def test_lock_boundary_follows_the_class_split() -> None:
    ctx = Ctx(tot_uuars=20, low_lat_uuars=8)        # high class from kernel bfreg 12
    assert need_uuar_lock(ctx, 21)                  # bfreg 11
    assert not need_uuar_lock(ctx, 24)              # bfreg 12


def test_provider_error_shape() -> None:
    err = ProviderError(errno.EINVAL, "f: why")
    assert isinstance(err, OSError) and err.errno == errno.EINVAL
    assert err.name == "EINVAL" and str(err) == "f: why (EINVAL)"
    with pytest.raises(ValueError):
        ProviderError(errno.EINVAL, "no function prefix")
    with pytest.raises(ValueError):
        ProviderError(99999, "f: unknown errno")
