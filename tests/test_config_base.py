"""A config's ``base:`` (`arl.config.read_config_data`): the file names the config it changes and
is deep-merged over it (mappings key by key; scalars, lists and null replace), before dotted
overrides and before `structure`, which therefore still names an unknown key by its dotted path."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from arl.config import CONFIG_DIR, ConfigError, load_config, packaged_configs, read_config_data, unstructure


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_mappings_merge_key_by_key_lists_and_null_replace(tmp_path):
    write(tmp_path / "a.yaml", "name: a\nsteps: 200\nalgo: {gamma: 0.5, kl_coef: 0.5}\n"
                               "engine: {max_model_len: 1024, kv_cache_memory_bytes: 268435456}\n"
                               "lora: {rank: 8, target_modules: [q_proj, v_proj]}\n")
    child = write(tmp_path / "b.yaml", "base: a.yaml\nname: b\nalgo: {kl_coef: 2.0}\n"
                                       "engine: {kv_cache_memory_bytes: null}\nlora: {target_modules: [q_proj]}\n")
    assert read_config_data(child) == {
        "name": "b", "steps": 200, "algo": {"gamma": 0.5, "kl_coef": 2.0},
        "engine": {"max_model_len": 1024, "kv_cache_memory_bytes": None},
        "lora": {"rank": 8, "target_modules": ["q_proj"]},  # the list replaced whole, not concatenated
    }
    config = load_config(child)
    assert (config.name, config.steps, config.algo.gamma, config.algo.kl_coef) == ("b", 200, 0.5, 2.0)
    assert config.engine.kv_cache_memory_bytes is None and config.engine.max_model_len == 1024
    assert config.lora.target_modules == ["q_proj"]


def test_a_mapping_of_the_base_keeps_its_keys_and_a_scalar_replaces_a_mapping(tmp_path):
    write(tmp_path / "a.yaml", "rollout: {proxy: {runner_kwargs: {conversation: step, x: 1}}}\nx: {y: 1}\n")
    child = write(tmp_path / "b.yaml", "base: a.yaml\nrollout: {proxy: {runner_kwargs: {}}}\nx: 3\n")
    assert read_config_data(child) == {"rollout": {"proxy": {"runner_kwargs": {"conversation": "step", "x": 1}}},
                                       "x": 3}


def test_a_chain_of_two_bases(tmp_path):
    write(tmp_path / "a.yaml", "name: a\nsteps: 7\noptim: {lr: 0.01, micro_batch_size: 8}\n")
    write(tmp_path / "b.yaml", "base: a.yaml\nname: b\noptim: {lr: 0.02}\neval: {num_seeds: 16}\n")
    c = write(tmp_path / "c.yaml", "base: b.yaml\nname: c\neval: {every: 3}\n")
    config = load_config(c)
    assert (config.name, config.steps, config.optim.lr, config.optim.micro_batch_size) == ("c", 7, 0.02, 8)
    assert (config.eval.num_seeds, config.eval.every) == (16, 3)
    assert "base" not in read_config_data(c)  # base itself never reaches structure()


def test_a_relative_base_is_read_from_the_naming_files_directory(tmp_path, monkeypatch):
    write(tmp_path / "shared" / "common.yaml", "steps: 11\n")
    write(tmp_path / "shared" / "mid.yaml", "base: common.yaml\nseed: 5\n")  # relative to shared/, not to exp/
    child = write(tmp_path / "exp" / "run.yaml", "base: ../shared/mid.yaml\nname: run\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write(elsewhere / "common.yaml", "steps: 99\n")  # the working directory plays no part
    monkeypatch.chdir(elsewhere)
    config = load_config(child)
    assert (config.steps, config.seed, config.name) == (11, 5, "run")
    assert load_config(Path("..") / "exp" / "run.yaml").steps == 11  # a relative path to the child works too
    absolute = write(tmp_path / "abs.yaml", f"base: {tmp_path / 'shared' / 'common.yaml'}\n")
    assert load_config(absolute).steps == 11


def test_a_cycle_raises_naming_its_files(tmp_path):
    write(tmp_path / "a.yaml", "base: b.yaml\n")
    write(tmp_path / "b.yaml", "base: c.yaml\n")
    write(tmp_path / "c.yaml", "base: a.yaml\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "a.yaml")
    message = str(err.value)
    assert "a.yaml -> " in message and all(f"{n}.yaml" in message for n in "abc"), message
    write(tmp_path / "self.yaml", "base: self.yaml\n")
    with pytest.raises(ConfigError, match=r"self\.yaml -> .*self\.yaml"):
        load_config(tmp_path / "self.yaml")


def test_a_missing_base_names_the_file_that_asked_and_the_path(tmp_path):
    write(tmp_path / "sub" / "a.yaml", "base: b.yaml\n")
    child = write(tmp_path / "child.yaml", "base: sub/a.yaml\n")
    with pytest.raises(ConfigError) as err:
        load_config(child)
    message = str(err.value)
    assert str(tmp_path / "sub" / "a.yaml") in message and "'b.yaml'" in message, message
    assert str(tmp_path / "sub" / "b.yaml") in message, message
    with pytest.raises(ConfigError, match="base must name a config"):
        load_config(write(tmp_path / "bad.yaml", "base: [a.yaml]\n"))


def test_overrides_apply_after_the_merge(tmp_path):
    write(tmp_path / "a.yaml", "steps: 5\noptim: {lr: 0.01, warmup_steps: 2}\n")
    child = write(tmp_path / "b.yaml", "base: a.yaml\noptim: {lr: 0.02}\n")
    config = load_config(child, ["optim.lr=0.03", "steps=6"])
    assert (config.optim.lr, config.optim.warmup_steps, config.steps) == (0.03, 2, 6)


def test_an_unknown_key_under_a_merged_section_names_its_dotted_path(tmp_path):
    write(tmp_path / "a.yaml", "rollout: {manager: {max_tokens: 8}}\n")
    child = write(tmp_path / "b.yaml", "base: a.yaml\nrollout: {manager: {max_tokenz: 9}}\n")
    with pytest.raises(ConfigError, match=r"max_tokenz.*@ rollout\.manager"):
        load_config(child)


def test_a_users_config_names_a_packaged_config_as_base(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mine = write(tmp_path / "mine.yaml", "base: tiny_frozenlake_gigpo\nname: mine\nsteps: 3\n")
    config, demo = load_config(mine), load_config("tiny_frozenlake_gigpo")
    assert (config.name, config.steps) == ("mine", 3)
    assert unstructure(config) == {**unstructure(demo), "name": "mine", "steps": 3}


def test_packaged_configs_with_a_base_load_by_name_and_from_a_copy_of_the_directory(tmp_path):
    """A packaged config's base is a sibling file (`arl/configs/` ships every *.yaml as package data),
    so it resolves wherever the directory is installed: a copy of it loads to the same configs."""
    with_base = [name for name in packaged_configs() if "base" in _top_keys(CONFIG_DIR / f"{name}.yaml")]
    assert "smollm2_sokoban_gigpo" in with_base and "qwen7b_frozenlake_lora" in with_base
    copy = tmp_path / "site-packages" / "arl" / "configs"
    shutil.copytree(CONFIG_DIR, copy)
    for name in with_base:
        by_name = load_config(name)
        assert by_name.name == name  # every config keeps its own name
        assert unstructure(load_config(copy / f"{name}.yaml")) == unstructure(by_name), name


def test_every_packaged_config_loads_keeps_its_name_and_points_at_its_notes():
    notes = (Path(__file__).resolve().parents[1] / "benchmarks" / "config-notes.md").read_text()
    for name in packaged_configs():
        text = (CONFIG_DIR / f"{name}.yaml").read_text()
        assert load_config(name).name == name
        assert f"\nname: {name}\n" in text, f"{name}: a config gives its own name, not its base's"
        assert f'benchmarks/config-notes.md, "{name}"' in " ".join(text.replace("#", " ").split()), name
        assert f"\n## {name}\n" in notes, name


def _top_keys(path: Path) -> set[str]:
    import yaml

    return set(yaml.safe_load(path.read_text()))
