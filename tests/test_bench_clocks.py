"""tritonkit.bench.clocks on the CPU: nvidia-smi's lines parsed, busy samples summarised, the sampler's thread, and
the report's note cell. The GPU side is nvidia-smi itself, read by every timed bench run."""

import threading
import time

import pytest

from tritonkit.bench import clocks, report
from tritonkit.bench.harness import Measurement


def test_a_query_line_is_parsed_and_a_field_that_is_no_number_gives_none():
    assert clocks.parse("1455, 690.12, 99, 0x0000000000000004") == clocks.Sample(1455.0, 690.12, 99.0, 4)
    assert clocks.parse(" 1980 , 119.5 , 0 , 0x0000000000000001 ") == clocks.Sample(1980.0, 119.5, 0.0, 1)
    assert clocks.parse("[N/A], 690.12, 99, 0x0000000000000004") is None
    assert clocks.parse("1455, 690.12, 99") is None  # a driver that answers fewer fields
    assert clocks.parse("") is None


def test_only_busy_samples_count_and_every_slowdown_is_named():
    idle = clocks.Sample(1980.0, 120.0, 0.0, 0x1)  # the gaps between timings: idle, top clock
    samples = [idle, clocks.Sample(1500.0, 690.0, 100.0, 0x4), clocks.Sample(1440.0, 700.0, 97.0, 0x4 | 0x20),
               clocks.Sample(1590.0, 680.0, 60.0, 0x0), idle]  # fmt: skip
    seen = clocks.summarize(samples)
    assert seen == clocks.Clocks(1500.0, 690.0, ("power cap", "thermal"))
    assert clocks.summarize([idle, idle]) is None
    assert clocks.summarize([]) is None


def test_the_sampler_reads_until_its_block_ends():
    twice = threading.Event()
    given = []

    def reader():
        given.append(clocks.Sample(1800.0 + len(given), 500.0, 100.0, 0))
        if len(given) >= 2:
            twice.set()
        return given[-1]

    with clocks.Sampler(reader=reader, interval_s=0.001) as sampler:
        assert twice.wait(5.0)
    count = len(sampler.samples)
    assert count >= 2 and sampler.samples == given[:count]
    assert sampler.clocks().sm_mhz == pytest.approx(1800.0 + (count - 1) / 2)


def test_nvidia_smi_is_asked_for_the_query_on_the_device(tmp_path, monkeypatch):
    script = tmp_path / "nvidia-smi"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'calls'}\necho '1455, 690.12, 99, 0x0000000000000004'\n")
    script.chmod(0o755)
    monkeypatch.setattr(clocks.shutil, "which", lambda name: str(script))
    assert clocks.read("GPU-1234") == clocks.Sample(1455.0, 690.12, 99.0, 4)
    with clocks.Sampler("GPU-1234", interval_s=0.001) as sampler:
        time.sleep(0.2)
    assert sampler.samples and set(sampler.samples) == {clocks.Sample(1455.0, 690.12, 99.0, 4)}
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 1 + len(sampler.samples)
    assert set(calls) == {f"--query-gpu={','.join(clocks.QUERY)} --format=csv,noheader,nounits --id=GPU-1234"}


def test_without_nvidia_smi_nothing_is_sampled(monkeypatch):
    monkeypatch.setattr(clocks.shutil, "which", lambda name: None)
    assert clocks.read() is None
    with clocks.Sampler() as sampler:
        pass
    assert sampler.samples == [] and sampler.clocks() is None


def test_the_report_notes_the_clocks_beside_the_input_sets():
    row = Measurement("add", "basic", {"n": 4}, "n4", "bfloat16", "fwd", "tritonkit", ms=0.5, gbps=100.0)
    assert report.rows_for_table([row])[0][-1] == ""
    row.sm_mhz, row.power_w, row.slowdowns, row.input_sets = 1455.0, 690.4, "power cap", 3
    assert report.rows_for_table([row])[0][-1] == "3 input sets; SM 1455 MHz, 690 W, power cap"
    row.slowdowns, row.input_sets = "", 1
    assert report.rows_for_table([row])[0][-1] == "SM 1455 MHz, 690 W"
