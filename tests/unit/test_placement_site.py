"""Site configs: every shipped site loads; validation names allowed values; accounting rules (B01 validation)."""

from __future__ import annotations

from pathlib import Path

import pytest
from golden.layouts import LAYOUTS, make_cfg

from toolkit.config import ConfigError
from toolkit.preflight.site import load_site, site_configs_dir


@pytest.mark.parametrize("name", ["local", "local-slurm", "prime-intellect", "generic-hpc"])
def test_shipped_sites_load(name: str) -> None:
    site = load_site(name)
    assert site.name == name and site.is_slurm == (name != "local")


def test_site_specifics() -> None:
    pi, hpc = load_site("prime-intellect"), load_site("generic-hpc")
    assert pi.gpu.request_style == "gres" and not pi.accounting.enabled and pi.submit_host == "controller"
    assert hpc.accounting.required and hpc.environment.modules and hpc.environment.container
    assert hpc.filesystem.node_local_scratch == "$TMPDIR" and hpc.limits.max_array_size == 500


def _write(tmp: Path, text: str) -> Path:
    p = tmp / "s.toml"
    p.write_text(text)
    return p


def test_unknown_gpu_style_names_allowed_values(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'gres', 'gpus-per-node' or 'gpus'"):
        load_site(_write(tmp_path, 'name = "x"\n[gpu]\nrequest_style = "gpu-count"\n'))


def test_unknown_key_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown key 'partiton'"):
        load_site(_write(tmp_path, 'name = "x"\npartiton = "gpu"\n'))


def test_port_range_overlapping_ephemeral_fails_to_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="ephemeral range"):
        load_site(_write(tmp_path, 'name = "x"\n[ports]\nrange_start = 40000\nrange_end = 41000\n'))


def test_scratch_must_be_path_or_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="node_local_scratch"):
        load_site(_write(tmp_path, 'name = "x"\n[filesystem]\nnode_local_scratch = "$(rm -rf ~)"\n'))


def test_account_rules() -> None:
    with pytest.raises(ConfigError, match="no accounting plugin"):
        make_cfg(LAYOUTS["train2-infer1"], site="prime-intellect", slurm={"account": "a"})
    with pytest.raises(ConfigError, match="requires an account"):
        make_cfg(
            LAYOUTS["train2-infer1"],
            site="generic-hpc",
            deployment={"gpus_per_node": 4},
            inference={"vllm": {"tensor_parallel_size": 4}},
        )


def test_gpus_per_node_beyond_site_nodes() -> None:
    with pytest.raises(ConfigError, match="nodes of site 'local-slurm' have 4"):
        make_cfg(LAYOUTS["train2-infer1"], site="local-slurm")


def test_unknown_site_lists_known(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown site 'nope'"):
        make_cfg(site="nope")
    assert (site_configs_dir() / "local.toml").exists()
