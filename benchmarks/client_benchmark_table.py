"""Markdown rows for docs/client-benchmark.md from test_client_benchmark.py's JSON output.

Usage: ``python benchmarks/client_benchmark_table.py client-benchmark-lab.json [more.json ...]``
(standard library only). Prints one row per scenario and reader, in the docs' column order,
then the rule's figures: skew and ITL error median as a share of the inter-token interval, and
the error of each stream's time per output token.
"""

from __future__ import annotations

import json
import sys

READER_ORDER = ["specgate-httpcore", "specgate", "aiohttp", "vllm-bench"]
READER_NAMES = {
    "specgate-httpcore": "specgate before (httpx + httpcore)",
    "specgate": "**specgate after** (httpx + aiohttp transport)",
}


def rows(paths: list[str]) -> list[dict]:
    found = []
    for path in paths:
        with open(path) as file:
            found += [bench["extra_info"] for bench in json.load(file)["benchmarks"]]
    return found


def main(paths: list[str]) -> None:
    infos = rows(paths)
    scenarios = list(dict.fromkeys(info["scenario"] for info in infos))
    rank = {name: index for index, name in enumerate(READER_ORDER)}
    ordered = sorted(infos, key=lambda i: (scenarios.index(i["scenario"]), rank.get(i["reader"], 99)))
    print("| scenario | reader | events/s (median) | CPU µs/event | skew median ms | skew p99 ms "
          "| ITL error median / p99 ms | load |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for info in ordered:
        burst = info["scenario"].startswith("burst")
        rate = f"{info['events_per_s_median']:,}".replace(",", " ") + ("" if burst else " (offered)")
        skew = f"{info['skew_ms_median']:.3f}" + (" (backlog)" if burst else "")
        itl = "-" if burst else f"{info['itl_error_ms_median']:.3f} / {info['itl_error_ms_p99']:.3f}"
        print(f"| {info['scenario']} | {READER_NAMES.get(info['reader'], info['reader'])} | {rate} "
              f"| {info['cpu_us_per_event_median']:.1f} | {skew} | {info['skew_ms_p99']:.3f} | {itl} "
              f"| {info.get('load_average_1m', '?')} |")
    print("\nShare of the inter-token interval: skew median, ITL error median; error of a stream's "
          "time per output token (the interval the gates measure), median and max over streams")
    for info in ordered:
        if info.get("skew_median_pct_of_interval") is not None:
            tpot = (f", TPOT {info['tpot_error_pct_median']} % / {info['tpot_error_pct_max']} % "
                    f"({info['streams_measured']} streams)" if info.get("tpot_error_pct_median") is not None else "")
            print(f"- {info['scenario']} {info['reader']}: {info['skew_median_pct_of_interval']} %, "
                  f"{info['itl_error_median_pct_of_interval']} %{tpot}")
    cpus = {info.get("cpu_count") for info in infos}
    print(f"\ncpu_count: {', '.join(str(c) for c in sorted(cpus, key=str))}")


if __name__ == "__main__":
    main(sys.argv[1:])
