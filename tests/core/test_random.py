"""Seed handling of kahm_dask._random: as_generator, as_seed_sequence, child_seed_sequence."""

import numpy as np
import pytest

from kahm_dask._random import as_generator, as_seed_sequence, child_seed_sequence


def _same_seed_sequence(s1: np.random.SeedSequence, s2: np.random.SeedSequence) -> bool:
    return (
        s1.entropy == s2.entropy
        and tuple(s1.spawn_key) == tuple(s2.spawn_key)
        and s1.pool_size == s2.pool_size
        and np.array_equal(s1.generate_state(8), s2.generate_state(8))
    )


def test_as_generator_accepts_all_seed_kinds():
    assert isinstance(as_generator(None), np.random.Generator)
    assert as_generator(7).random() == as_generator(np.int64(7)).random()
    assert as_generator(7).random() == np.random.default_rng(7).random()
    ss = np.random.SeedSequence(11)
    assert as_generator(ss).random() == np.random.default_rng(ss).random()
    rng = np.random.default_rng(3)
    assert as_generator(rng) is rng


@pytest.mark.parametrize("bad", [True, 1.5, "3", np.random.RandomState(0)])
def test_as_generator_rejects_other_types(bad):
    with pytest.raises(TypeError, match="random_state"):
        as_generator(bad)


def test_negative_int_seed_is_a_value_error():
    with pytest.raises(ValueError, match="non-negative"):
        as_generator(-1)
    with pytest.raises(ValueError, match="non-negative"):
        as_seed_sequence(-1)


def test_as_seed_sequence_accepts_all_seed_kinds():
    ss = np.random.SeedSequence(5)
    assert as_seed_sequence(ss) is ss
    assert _same_seed_sequence(as_seed_sequence(5), np.random.SeedSequence(5))
    assert isinstance(as_seed_sequence(None), np.random.SeedSequence)
    assert as_seed_sequence(None).entropy != as_seed_sequence(None).entropy
    with pytest.raises(TypeError, match="random_state"):
        as_seed_sequence(2.0)


def test_as_seed_sequence_of_generator_uses_its_seed_seq_without_advancing_it():
    rng = np.random.default_rng(42)
    state = rng.bit_generator.state
    assert _same_seed_sequence(as_seed_sequence(rng), np.random.SeedSequence(42))
    assert rng.bit_generator.state == state


def test_as_seed_sequence_of_generator_without_seed_seq_draws_entropy():
    def legacy_generator() -> np.random.Generator:
        bit_generator = np.random.MT19937()
        bit_generator._legacy_seeding(5)
        return np.random.Generator(bit_generator)

    assert legacy_generator().bit_generator.seed_seq is None
    s1, s2 = as_seed_sequence(legacy_generator()), as_seed_sequence(legacy_generator())
    assert _same_seed_sequence(s1, s2)  # deterministic given the generator's state


@pytest.mark.parametrize("root_key", [(), (3,), (1, 4)])
def test_child_seed_sequence_equals_spawned_child(root_key):
    root = np.random.SeedSequence(12345, spawn_key=root_key)
    children = np.random.SeedSequence(12345, spawn_key=root_key).spawn(6)
    for i, child in enumerate(children):
        assert _same_seed_sequence(child_seed_sequence(root, i), child)
    assert root.n_children_spawned == 0  # no siblings were spawned


def test_child_seed_sequence_multi_level_key():
    root = np.random.SeedSequence(99)
    grandchild = np.random.SeedSequence(99).spawn(3)[2].spawn(5)[4]
    assert _same_seed_sequence(child_seed_sequence(root, 2, 4), grandchild)
    assert _same_seed_sequence(child_seed_sequence(root), root)


def test_child_seed_sequence_checks_arguments():
    with pytest.raises(TypeError, match="SeedSequence"):
        child_seed_sequence(5, 0)
    with pytest.raises(ValueError, match="key"):
        child_seed_sequence(np.random.SeedSequence(1), -1)
    with pytest.raises(ValueError, match="key"):
        child_seed_sequence(np.random.SeedSequence(1), 1.0)
