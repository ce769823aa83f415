"""Effect-key values a server reads as another spelling of the same id (``profile: http``)."""

from __future__ import annotations

import pytest

from ctrlrun.proxy.key_spellings import respelt


@pytest.mark.parametrize(
    "value",
    [
        "007",
        "+7",
        "-0",
        "7.0",
        "7.",
        ".5",
        "7e0",
        "1E3",
        "0x7",
        "0X1f",
        "0o7",
        "0b1",
        "7_0",
        "\u0667",
        "\uff17",
        " 7",
        "7 ",
        "\t7",
        "o1 ",
        "\u00a0o1",
    ],
)
def test_a_value_spelt_otherwise_is_refused(value: str) -> None:
    assert respelt(["order"], {"order": value}) is not None


@pytest.mark.parametrize(
    "value",
    [
        "7",
        "0",
        "-7",
        "9007199254740993",
        "o1",
        "ord-007",
        "2024-01-07",
        "7abc",
        "inf",
        "nan",
        "Infinity",
        "1.2.3",
        "0xg",
        "0b1c3e",
        "0o8",
        "pi_007",
        "in_1e3",
        "a b",
    ],
)
def test_a_plain_value_passes(value: str) -> None:
    assert respelt(["order"], {"order": value}) is None


def test_only_the_effect_keys_values_are_read() -> None:
    assert respelt(["order"], {"order": 7, "note": "007", "amount": " 5"}) is None
    assert respelt(["resource"], {}) is None


@pytest.mark.parametrize("value", ["yes", "TRUE", "on", "Off", "t", "n"])
def test_a_flag_word_is_refused_only_where_flags_are_read(value: str) -> None:
    assert respelt(["full"], {"full": value}, flags=True) is not None
    assert respelt(["full"], {"full": value}) is None


@pytest.mark.parametrize("value", ["1", "0", "yess", "ton", 1])
def test_a_plain_flag_passes(value: object) -> None:
    assert respelt(["full"], {"full": value}, flags=True) is None
