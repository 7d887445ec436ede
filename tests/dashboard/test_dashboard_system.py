"""The system panel (this machine's CPU, memory and, where NVML answers, GPU over time) and the MFU chart,
in a real headless Chromium against a real server on a live run directory."""

from __future__ import annotations

import psutil
import pytest

from conftest import ARTIFACTS, assert_not_blank, make_run
from dashboard.system import flops_per_token, mfu_info, peak_flops
from proxy.gpu_identity import GpuIdentityError, read_gpu_usage

READY = "() => window.__dashboard && window.__dashboard.ready"


def gpu_here() -> str | None:
    """This machine's GPU as NVML names it, or None."""
    try:
        return read_gpu_usage().gpu
    except GpuIdentityError:
        return None


def chart(page, chart_id: str) -> dict:
    return page.evaluate(f"() => window.__dashboardChart('{chart_id}')")


def system_chart(page, chart_id: str) -> dict | None:
    return page.evaluate(
        f"() => {{ const u = window.DashSystem.chart('{chart_id}'); return u && "
        "{labels: u.series.map((s) => s.label), data: u.data.map((c) => Array.from(c))}; }"
    )


def test_system_panel_samples_this_machine_over_time(tmp_path, server_factory, page, live_writer):
    run = make_run(tmp_path / "run-a", steps=300)
    srv = server_factory([run.root])
    srv.wait_indexed()
    page.goto(srv.url)
    page.wait_for_function(READY, timeout=10000)
    live_writer(run, rate=10)
    # a sample every 2 s, the page asks every 5 s: three samples on the chart within 15 s
    page.wait_for_function(
        "() => { const u = window.DashSystem.chart('chart-cpu'); return u && u.data[0].length >= 3; }", timeout=20000
    )
    c = system_chart(page, "chart-cpu")
    assert c["labels"] == ["time", "CPU", "memory"]
    times, cpu, mem = c["data"]
    assert times == sorted(times) and all(b - a >= 1.5 for a, b in zip(times, times[1:], strict=False))
    assert all(0 <= v <= 100 for v in cpu)
    # memory in use as psutil sees it from here, within a few points (the machine is shared)
    vm = psutil.virtual_memory()
    assert mem[-1] == pytest.approx(100 * (vm.total - vm.available) / vm.total, abs=10)
    note = page.locator("#system-note").inner_text()
    assert f"{psutil.cpu_count()} CPUs" in note and "the dashboard's machine" in note
    api = srv.get("/api/system").json()
    assert api["cpus"] == psutil.cpu_count() and len(api["samples"]["time"]) >= 3
    assert srv.get(f"/api/system?since={api['samples']['time'][-1]}").json()["samples"]["time"] == []

    gpu = gpu_here()
    if gpu is None:  # CPU only, and the panel says there is no GPU and why
        assert api["gpu"] is None and api["no_gpu"]
        assert "no GPU" in note
        empty = page.locator("#chart-gpu > .chart-empty").inner_text()
        assert empty.startswith("no GPU: ") and api["no_gpu"] in empty
        assert system_chart(page, "chart-gpu") is None
    else:  # NVML's numbers, charted
        assert api["gpu"] == gpu and api["no_gpu"] is None
        g = system_chart(page, "chart-gpu")
        assert g["labels"] == ["time", "GPU utilisation", "GPU memory"]
        assert all(0 <= v <= 100 for v in g["data"][1] + g["data"][2]) and g["data"][2][-1] > 0
        assert f"GPU {gpu}" in note
    # the CPU engine has no MFU, and the chart says why
    assert page.locator("#chart-mfu > .chart-empty").inner_text() == "run-a: MFU is for the CUDA engine (this run: cpu)"
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("section.system").screenshot(path=str(ARTIFACTS / "dashboard-system.png"))
    assert_not_blank(ARTIFACTS / "dashboard-system.png")
    assert not page.console_errors, page.console_errors


def test_mfu_of_a_cuda_run(tmp_path, server_factory, page):
    """A run whose .state.json says the CUDA engine ran it on an H100 in bf16: its MFU at each point is the
    engine's tokens/s times 6N + 12·L·d·T FLOPs a token, over 989.4 TFLOP/s."""
    run = make_run(tmp_path / "run-a", steps=300)
    n_params = 124_475_904
    run.engine_extra = dict(kind="cuda", device="NVIDIA H100 80GB HBM3, attention flash", precision="bf16")
    run.engine_extra["n_params"] = n_params
    run.write_state()
    srv = server_factory([run.root])
    srv.wait_indexed()
    info = srv.get("/api/runs/0/mfu").json()
    per_token = 6 * n_params + 12 * 2 * 64 * 64  # the synthetic experiment: layers 2, dim 64, ctx 64
    assert info == {
        "flops_per_token": per_token,
        "peak_flops": 989.4e12,
        "gpu": "NVIDIA H100 80GB HBM3",
        "precision": "bf16",
    }
    page.goto(srv.url + "?static=1")
    page.wait_for_function(READY, timeout=10000)
    mfu, tps = chart(page, "chart-mfu"), chart(page, "chart-tps")
    assert mfu["empty"] is None and mfu["labels"][1:] == ["run-a"]
    pairs = [(m, t) for m, t in zip(mfu["data"][1], tps["data"][1], strict=True) if t is not None]
    assert len(pairs) >= 300
    for m, t in pairs:
        assert m == pytest.approx(100 * t * per_token / 989.4e12, rel=1e-9)
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#chart-mfu").screenshot(path=str(ARTIFACTS / "dashboard-mfu.png"))
    assert_not_blank(ARTIFACTS / "dashboard-mfu.png")
    assert not page.console_errors, page.console_errors


def test_mfu_says_why_not():
    cuda = {"kind": "cuda", "device": "NVIDIA H100 80GB HBM3", "precision": "fp32", "n_params": 1000}
    model = {"model": {"layers": 2, "dim": 64, "ctx": 64}}
    assert mfu_info(cuda, None) == {"why": "MFU is for the CUDA engine (this run: engine unknown)"}
    assert mfu_info({"engine": cuda}, model)["peak_flops"] == 66.9e12  # fp32: CUDA cores, never TF32
    assert mfu_info({"engine": dict(cuda, n_params=None)}, model)["why"].startswith("MFU needs")
    assert mfu_info({"engine": dict(cuda, device="Tesla T4")}, model) == {
        "why": "no peak FLOP/s known for Tesla T4 at fp32"
    }
    assert peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12 and peak_flops("NVIDIA H200", "bf16") == 989.4e12
    assert flops_per_token(10, 2, 4, 8) == 6 * 10 + 12 * 2 * 4 * 8
