"""Operator settings from env vars and flags: defaults, overrides, one-line errors."""

import dataclasses

import pytest

from finetune_operator.__main__ import build_parser, main, settings_from
from finetune_operator.setting_parsers import SettingsError
from finetune_operator.settings import SETTINGS, Settings, check, from_env


def test_defaults_are_cluster_wide_with_the_standard_gpu_keys():
    s = from_env({})
    assert s.clusterwide
    assert s.gpu_product_label == "nvidia.com/gpu.product"
    assert s.gpu_tolerations == ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},)


def test_env_vars_feed_every_setting():
    s = from_env(
        {
            "FINETUNE_TRAINER_IMAGE": "r/t:2",
            "FINETUNE_GPU_PRODUCT_LABEL": "example.com/gpu-model",
            "FINETUNE_GPU_TOLERATIONS": '[{"key": "gpu", "operator": "Exists"}]',
            "FINETUNE_DEFAULT_CPU": "4",
            "FINETUNE_DEFAULT_MEMORY": "32Gi",
            "FINETUNE_NAMESPACES": "a, b",
            "FINETUNE_METRICS_PORT": "9100",
            "FINETUNE_LOG_LEVEL": "debug",
        }
    )
    assert s.trainer_image == "r/t:2"
    assert s.gpu_product_label == "example.com/gpu-model"
    assert s.gpu_tolerations == ({"key": "gpu", "operator": "Exists"},)
    assert (s.default_cpu, s.default_memory) == ("4", "32Gi")
    assert s.namespaces == ("a", "b") and not s.clusterwide
    assert s.metrics_port == 9100 and s.log_level == "DEBUG"


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("FINETUNE_METRICS_PORT", "http", "FINETUNE_METRICS_PORT: expected a port number"),
        ("FINETUNE_GPU_TOLERATIONS", "[{", "FINETUNE_GPU_TOLERATIONS: not JSON"),
        ("FINETUNE_DEFAULT_MEMORY", "lots", "FINETUNE_DEFAULT_MEMORY: 'lots' is not a Kubernetes quantity"),
        ("FINETUNE_LOG_FORMAT", "xml", "FINETUNE_LOG_FORMAT: expected one of json, text"),
        ("FINETUNE_HOST_MEMORY_PER_GPU", '{"Tesla-P40": "lots"}', "FINETUNE_HOST_MEMORY_PER_GPU: Tesla-P40: 'lots'"),
        ("FINETUNE_HOST_MEMORY_PER_GPU", '{"GeForce-256": "8Gi"}', "'GeForce-256' is not a GPU product the planner"),
        ("FINETUNE_HOST_MEMORY_PER_GPU", '["48Gi"]', "expected a JSON object of GPU products"),
    ],
)
def test_bad_values_name_the_variable(name, value, fragment):
    with pytest.raises(SettingsError, match=fragment):
        from_env({name: value})


def test_flags_win_over_env():
    args = build_parser().parse_args(["-n", "x", "-n", "y", "--trainer-image", "t:3", "--metrics-port", "0"])
    s = settings_from(args, Settings(namespaces=("z",)))
    assert s.namespaces == ("x", "y") and s.trainer_image == "t:3" and s.metrics_port == 0
    assert settings_from(build_parser().parse_args(["-A"]), Settings(namespaces=("z",))).clusterwide


def test_flags_follow_the_table_and_a_bad_one_is_named_in_one_line(capsys):
    options = {o for action in build_parser()._actions for o in action.option_strings}
    for row in SETTINGS.values():
        assert set(row.flag) <= options, row.name
    assert settings_from(build_parser().parse_args(["--leader-elect"]), Settings()).leader_election
    assert not settings_from(
        build_parser().parse_args(["--no-leader-elect"]), Settings(leader_election=True)
    ).leader_election
    assert settings_from(build_parser().parse_args(["--log-level", "debug"]), Settings()).log_level == "DEBUG"
    assert main(["--metrics-port", "99999"]) == 2
    assert capsys.readouterr().err == "error: --metrics-port: port 99999 is outside 0-65535\n"


def test_the_table_has_one_row_per_variable_and_flag():
    envs = [row.env for row in SETTINGS.values()]
    flags = [flag for row in SETTINGS.values() for flag in row.flag]
    assert len(envs) == len(set(envs)) and len(flags) == len(set(flags))
    assert all(row.doc and row.env.isupper() for row in SETTINGS.values())
    # Every field is a setting but the one no variable sets.
    assert set(SETTINGS) == {f.name for f in dataclasses.fields(Settings)} - {"preflight_deadline_seconds"}


def test_main_prints_one_line_on_a_bad_setting(monkeypatch, capsys):
    monkeypatch.setenv("FINETUNE_HEALTH_PORT", "99999")
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "error: FINETUNE_HEALTH_PORT: port 99999 is outside 0-65535"


def test_allow_list_and_disk_settings_come_from_env():
    s = from_env(
        {
            "FINETUNE_ALLOWED_IMAGES": '["ghcr.io/finetune-operator/trainer", "registry.example.com/ml/*"]',
            "FINETUNE_SHM_MEMORY_FRACTION": "0.25",
            "FINETUNE_TMP_SIZE": "20Gi",
            "FINETUNE_EPHEMERAL_STORAGE_REQUEST": "2Gi",
            "FINETUNE_HUB_ENV": '{"HF_ENDPOINT": "https://hub.internal.example"}',
            "FINETUNE_EXCLUDED_NAMESPACES": "finetune-system,kube-system,vault",
        }
    )
    assert s.allowed_images == ("ghcr.io/finetune-operator/trainer", "registry.example.com/ml/*")
    assert (s.shm_memory_fraction, s.tmp_size, s.ephemeral_storage_request) == (0.25, "20Gi", "2Gi")
    assert s.hub_env == {"HF_ENDPOINT": "https://hub.internal.example"}
    # The system namespaces stay excluded whatever the list says.
    assert s.excluded_namespaces == ("kube-system", "kube-public", "kube-node-lease", "finetune-system", "vault")


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("FINETUNE_ALLOWED_IMAGES", "ghcr.io/x", "FINETUNE_ALLOWED_IMAGES: not JSON"),
        ("FINETUNE_ALLOWED_IMAGES", "[]", "FINETUNE_ALLOWED_IMAGES: expected a non-empty JSON list"),
        ("FINETUNE_ALLOWED_IMAGES", '["reg/*/x"]', r"pattern 'reg/\*/x': `\*` is allowed only at the end"),
        ("FINETUNE_SHM_MEMORY_FRACTION", "2", r"FINETUNE_SHM_MEMORY_FRACTION: 2.0 is not a fraction in \(0, 1\]"),
        ("FINETUNE_SHM_MEMORY_FRACTION", "half", "FINETUNE_SHM_MEMORY_FRACTION: expected a number"),
        ("FINETUNE_TMP_SIZE", "big", "FINETUNE_TMP_SIZE: 'big' is not a Kubernetes quantity"),
        ("FINETUNE_HUB_ENV", '["HF_ENDPOINT"]', "FINETUNE_HUB_ENV: expected a JSON object"),
        ("FINETUNE_HUB_ENV", '{"LD_PRELOAD": "x"}', "FINETUNE_HUB_ENV: LD_PRELOAD not among HF_ENDPOINT"),
    ],
)
def test_bad_security_values_name_the_variable(name, value, fragment):
    with pytest.raises(SettingsError, match=fragment):
        from_env({name: value})


def test_a_default_image_outside_the_allow_list_stops_the_operator_in_one_line(monkeypatch, capsys):
    assert check(Settings()) == Settings()
    with pytest.raises(SettingsError, match="FINETUNE_TRAINER_IMAGE: the default trainer image 'r/t:2' is not in"):
        check(Settings(trainer_image="r/t:2"))
    monkeypatch.setenv("FINETUNE_TRAINER_IMAGE", "docker.io/evil/miner:latest")
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "FINETUNE_ALLOWED_IMAGES" in err and "Traceback" not in err


def test_guardrails_come_from_env_and_zero_means_no_limit():
    env = {
        "FINETUNE_MAX_GPUS_PER_JOB": "8",
        "FINETUNE_MAX_NODES_PER_JOB": "0",
        "FINETUNE_DEFAULT_ACTIVE_DEADLINE_SECONDS": "86400",
        "FINETUNE_PENDING_TIMEOUT_SECONDS": "600",
    }
    s = from_env(env)
    assert (s.max_gpus_per_job, s.max_nodes_per_job) == (8, None)
    assert (s.default_active_deadline_seconds, s.pending_timeout_seconds) == (86400, 600)
    with pytest.raises(SettingsError, match=r"^FINETUNE_PENDING_TIMEOUT_SECONDS: expected a whole number"):
        from_env({"FINETUNE_PENDING_TIMEOUT_SECONDS": "10m"})


def test_the_input_check_settings_come_from_env_and_bad_ones_name_the_variable():
    assert (Settings().preflight, Settings().preflight_cpu, Settings().preflight_memory) == (True, "1", "2Gi")
    env = {"FINETUNE_PREFLIGHT": "false", "FINETUNE_PREFLIGHT_CPU": "500m", "FINETUNE_PREFLIGHT_MEMORY": "8Gi"}
    settings = from_env(env)
    assert (settings.preflight, settings.preflight_cpu, settings.preflight_memory) == (False, "500m", "8Gi")
    with pytest.raises(SettingsError, match="FINETUNE_PREFLIGHT: expected one of true, false"):
        from_env({"FINETUNE_PREFLIGHT": "maybe"})
    with pytest.raises(SettingsError, match="FINETUNE_PREFLIGHT_MEMORY"):
        from_env({"FINETUNE_PREFLIGHT_MEMORY": "lots"})


def test_host_memory_per_gpu_is_by_product_as_torch_or_the_label_names_it():
    s = from_env({"FINETUNE_HOST_MEMORY_PER_GPU": '{"Tesla-P40": "48Gi", "NVIDIA-A100-80GB": "200Gi"}'})
    assert s.host_memory_for("Tesla-P40") == s.host_memory_for("Tesla P40") == 48 * 2**30
    assert s.host_memory_for("NVIDIA A100-SXM4-80GB") == 200 * 2**30
    assert s.host_memory_for("NVIDIA-A100-40GB") is None  # the planner's default stands
    assert from_env({}).host_memory_for("Tesla-P40") is None
