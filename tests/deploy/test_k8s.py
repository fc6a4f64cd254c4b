"""deploy/k8s against the Kubernetes and KEDA schemas, offline: every core object with
kubernetes-validate (the Kubernetes OpenAPI schemas as JSON Schema, bundled in its wheel; strict:
an unknown field fails), the ScaledObject with cloudcoil's KEDA models (generated from KEDA's CRD;
a field the model drops is an unknown one). Then the pairings a schema cannot see."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.keda.v1alpha1 import ScaledObject

ROOT = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
K8S_VERSION = "1.30"
FILES = sorted(p for p in ROOT.glob("*.yaml") if p.name != "kustomization.yaml")


def objects(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def all_objects() -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for p in FILES for o in objects(p)}


def dropped(given: Any, kept: Any, where: str = "") -> list[str]:
    """Paths in `given` that the model did not keep: fields KEDA's schema does not have."""
    if isinstance(given, dict):
        out = []
        for k, v in given.items():
            if not isinstance(kept, dict) or k not in kept:
                out.append(f"{where}.{k}")
            else:
                out += dropped(v, kept[k], f"{where}.{k}")
        return out
    if isinstance(given, list):
        return [
            p
            for i, (g, k) in enumerate(zip(given, kept, strict=True))
            for p in dropped(g, k, f"{where}[{i}]")
        ]
    return []


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_object_validates(path: Path) -> None:
    for obj in objects(path):
        if obj["apiVersion"].startswith("keda.sh/"):
            model = ScaledObject.model_validate(obj)
            assert not dropped(obj, model.model_dump(by_alias=True, exclude_unset=True)), obj["kind"]
        else:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_the_validators_refuse_a_bad_object() -> None:
    worker = all_objects()[("Deployment", "kvferry-worker")]
    bad = {**worker, "spec": {**worker["spec"], "replicas": "two"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)
    typo = {**worker, "spec": {**worker["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, K8S_VERSION, strict=True)
    scaled = all_objects()[("ScaledObject", "kvferry-worker")]
    typo = {**scaled, "spec": {**scaled["spec"], "minReplicas": 1}}
    model = ScaledObject.model_validate(typo)
    assert dropped(typo, model.model_dump(by_alias=True, exclude_unset=True)) == [".spec.minReplicas"]


def test_kustomization_lists_every_applied_file() -> None:
    listed = set(yaml.safe_load((ROOT / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in FILES} - {"secret.example.yaml"}


def test_grace_period_covers_the_drain() -> None:
    """SIGKILL must never come before the drain ends: grace >= drain timeout + 30 s of write-through."""
    objs = all_objects()
    drain = float(objs[("ConfigMap", "kvferry-config")]["data"]["KVFERRY_DRAIN_TIMEOUT_S"])
    pod = objs[("Deployment", "kvferry-worker")]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= drain + 30
    assert "--drain-timeout" not in pod["containers"][0]["command"]  # one source: the ConfigMap


def test_keda_scales_the_workers_on_the_policy() -> None:
    objs = all_objects()
    spec = objs[("ScaledObject", "kvferry-worker")]["spec"]
    assert spec["scaleTargetRef"]["name"] == "kvferry-worker"
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert "kvferry_desired_workers" in trigger["metadata"]["query"]
    assert trigger["metadata"]["threshold"] == "1"  # replicas = the policy's figure
    config = objs[("ConfigMap", "kvferry-config")]["data"]
    assert spec["minReplicaCount"] == int(config["KVFERRY_SCALE_MIN_WORKERS"])
    assert spec["maxReplicaCount"] == int(config["KVFERRY_SCALE_MAX_WORKERS"])


def test_secrets_come_from_the_secret_never_inline() -> None:
    for (kind, _), obj in all_objects().items():
        if kind not in ("Deployment", "StatefulSet"):
            continue
        for c in obj["spec"]["template"]["spec"]["containers"]:
            for e in c.get("env", []):
                if any(w in e["name"] for w in ("PASSWORD", "URL", "KEY", "TOKEN", "AUTH")):
                    assert "valueFrom" in e and "value" not in e, e["name"]
