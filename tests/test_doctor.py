"""``kforge doctor``: every check reported, failures with their fix, the exit code from the required ones."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from kforge import doctor


def _run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "kforge.cli", "doctor", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def test_doctor_json_lists_every_check_and_is_healthy_here():
    out = _run("--json", env={"ANTHROPIC_API_KEY": "sk-test-not-a-real-key"})
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    checks = {c["name"]: c for c in data["checks"]}
    assert data["healthy"] is True
    assert checks["torch"]["ok"] and checks["C compiler (CPU backend)"]["ok"] and checks["cache"]["ok"]
    assert checks["Anthropic key"]["ok"] and "sk-test" not in out.stdout, "a key is reported as set, never shown"
    assert all(c["fix"] for c in data["checks"] if not c["ok"]), "every failed check says what to do"
    from kforge.kernels import find_nvcc
    if find_nvcc() is not None:
        assert checks["nvcc (CUDA backend)"]["ok"] and "builds for sm_" in checks["nvcc (CUDA backend)"]["detail"]


def test_doctor_reports_a_missing_compiler_as_fatal_with_its_fix(tmp_path):
    out = _run(env={"CC": str(tmp_path / "no-such-cc"), "KFORGE_CACHE": str(tmp_path / "cache"),
                    "KFORGE_FASTPATH": "0", "OPENAI_API_KEY": ""})
    assert out.returncode == 1
    assert "FAIL C compiler (CPU backend)" in out.stdout and "fix CC" in out.stdout and "cannot run" in out.stdout
    assert "KFORGE_FASTPATH=0" in out.stdout
    assert "OPENAI_API_KEY is not set" in out.stdout and "built-in proposer needs no key" in out.stdout


def test_healthy_depends_on_required_checks_only():
    ok = doctor.Check("a", True, "", required=True)
    optional_fail = doctor.Check("b", False, "", "fix b")
    required_fail = doctor.Check("c", False, "", "fix c", required=True)
    assert doctor.healthy([ok, optional_fail]) and not doctor.healthy([ok, required_fail])
    text = doctor.report([ok, optional_fail, required_fail])
    assert "FAIL c" in text and "-> fix c" in text and "-> fix b" in text


def test_a_check_that_raises_is_reported_not_a_traceback(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = _run(env={"KFORGE_CACHE": str(blocker)})
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "FAIL cache" in out.stdout and "the check itself failed" in out.stdout


def test_a_key_in_the_config_file_counts(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text('[openai]\napi_key = "sk-from-file"\n')
    data = json.loads(_run("--json", env={"KFORGE_CONFIG": str(cfg), "OPENAI_API_KEY": ""}).stdout)
    (check,) = [c for c in data["checks"] if c["name"] == "OpenAI key"]
    assert check["ok"] and "sk-from-file" not in json.dumps(data)
