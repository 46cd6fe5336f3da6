//! The report's tables from made-up results.

use super::*;
use crate::bench::{
    procs::CpuTime,
    traffic::{MachineRun, Target, kernel_targets},
    wrk::WrkResult,
};

fn transfers(t: &Target, mbps: f64, machine: f64) -> Transfers {
    Transfers {
        target: t.clone(),
        mbps: vec![mbps],
        proxy_us_per_mb: if t.hairpin || t.haproxy {
            vec![machine / 2.0]
        } else {
            Vec::new()
        },
        machine_us_per_mb: vec![machine],
    }
}

/// One round of 1000 requests that cost `us` µs each, split evenly over two
/// CPUs, each run for 1 s of which 0.1 s was stolen.
fn machine(us: f64) -> MachineRun {
    let cpu = CpuTime {
        busy_us: us * 500.0,
        steal_us: 100_000.0,
        total_us: 1_000_000.0,
    };
    MachineRun {
        cpus: vec![cpu, cpu],
        requests: 1000,
    }
}

fn runs(t: &Target, rps: f64, p99_us: f64) -> RateRuns {
    RateRuns {
        cpu_us_per_request: Vec::new(),
        machine: vec![machine(1e6 / rps * 0.9)],
        target: t.clone(),
        runs: vec![WrkResult {
            requests_per_sec: rps,
            p50_us: p99_us / 2.0,
            p99_us,
            requests: 1000,
            errors: 0,
        }],
    }
}

#[test]
fn the_relay_rows_report_proxy_and_machine_cpu_against_haproxy() {
    let mut r = Results::default();
    for t in crate::bench::traffic::targets() {
        let mut x = runs(&t, if t.hairpin { 9_000.0 } else { 10_000.0 }, 1_000.0);
        x.cpu_us_per_request = vec![if t.hairpin { 110.0 } else { 100.0 }];
        r.rate.push(x);
        if !t.name.contains("v2") {
            let (mbps, machine) = match (t.hairpin, t.haproxy) {
                (true, _) => (950.0, 800.0),
                (_, true) => (500.0, 1200.0),
                _ => (1000.0, 600.0),
            };
            r.bulk.push(transfers(&t, mbps, machine));
            r.upload.push(transfers(&t, mbps * 0.8, machine));
        }
    }
    r.aa = Some(aa_check(
        &[10_000.0, 10_100.0, 9_900.0],
        &[10_050.0, 10_000.0, 9_950.0],
    ));
    let mut out = String::new();
    main_table(&r, &mut out);
    // Machine: 1e6/rps * 0.9 µs per request: 100 for the relay, 90 for HAProxy.
    for row in [
        "| new connections/s, **relay**, PROXY v1 | 9000 | HAProxy send-proxy: 10000 | 0.90× | ≥ 1.30× | **missed** |",
        "| proxy CPU per request, **relay**, PROXY v1 (µs) | 110.0 | HAProxy send-proxy: 100.0 | 1.10× | — | reported |",
        "| machine CPU per request, **relay**, PROXY v1 (µs, all CPUs) | 100.0 | HAProxy send-proxy: 90.0 | 1.11× | < HAProxy | **missed** |",
        "| proxy CPU per request, **relay**, PROXY v2 (µs) | 110.0 | HAProxy send-proxy-v2: 100.0 | 1.10× | — | reported |",
        "| machine CPU per request, **relay**, PROXY v2 (µs, all CPUs) | 100.0 | HAProxy send-proxy-v2: 90.0 | 1.11× | < HAProxy | **missed** |",
        "| bulk download, **relay** (MB/s) | 950 | direct: 1000; HAProxy: 500 (relay/HAProxy 1.90×) | 0.95× | ≥ 0.90× direct | **met** |",
        "| relay CPU per MB, bulk download, **relay** (µs, the agent's process) | 400 | HAProxy: 600 | 0.67× | — | reported |",
        "| machine CPU per MB, bulk download, **relay** (µs, all CPUs) | 800 | direct: 600; HAProxy: 1200 | 1.33× | — | reported |",
        "| bulk upload, **relay** (MB/s) | 760 | direct: 800; HAProxy: 400 (relay/HAProxy 1.90×) | 0.95× | ≥ 0.90× direct | **met** |",
    ] {
        assert!(out.lines().any(|l| l == row), "{row}\nnot in\n{out}");
    }
}

/// An A/A check whose sides ran at these rates.
fn aa_check(a: &[f64], b: &[f64]) -> crate::bench::aa::AaCheck {
    let [ta, tb] = [0, 1].map(|i| crate::bench::aa::targets()[i].clone());
    crate::bench::aa::AaCheck {
        a: rounds(&ta, a),
        b: rounds(&tb, b),
    }
}

#[test]
fn verdicts_on_ratios_wait_for_an_a_a_check_within_three_percent() {
    let mut r = Results::default();
    for t in crate::bench::traffic::targets() {
        r.rate.push(runs(
            &t,
            if t.hairpin { 9_000.0 } else { 10_000.0 },
            1_000.0,
        ));
    }
    let verdicts = |r: &Results| {
        let mut out = String::new();
        main_table(r, &mut out);
        out.lines()
            .find(|l| l.starts_with("| new connections/s, **relay**, PROXY v1 |"))
            .map(|l| l.rsplit(" | ").next().unwrap_or_default().to_string())
            .unwrap_or_default()
    };
    assert_eq!(verdicts(&r), "not judged: no A/A check |");
    // Side A 5% faster in every round: the bench cannot tell 5% from nothing.
    r.aa = Some(aa_check(&[10_500.0, 10_500.0, 10_500.0], &[10_000.0; 3]));
    assert!(!r.aa.as_ref().unwrap().passes());
    assert!(
        verdicts(&r).starts_with(
            "not judged: A/A rate 1.05× [1.05–1.05], CPU 0.95× [0.95–0.95] outside 0.97–1.03"
        ),
        "{}",
        verdicts(&r)
    );
    r.aa = Some(aa_check(&[10_100.0, 9_900.0, 10_000.0], &[10_000.0; 3]));
    assert!(r.aa.as_ref().unwrap().passes());
    assert_eq!(verdicts(&r), "**missed** |");
}

/// Rounds of one target with these rates (p99 1 ms, 1000 requests each).
fn rounds(t: &Target, rps: &[f64]) -> RateRuns {
    let mut r = runs(t, rps[0], 1_000.0);
    r.runs = (rps.iter())
        .map(|&requests_per_sec| WrkResult {
            requests_per_sec,
            ..r.runs[0].clone()
        })
        .collect();
    r.machine = rps.iter().map(|&x| machine(1e6 / x * 0.9)).collect();
    r
}

#[test]
fn ratios_pair_the_rounds_that_ran_back_to_back() {
    // The machine drifted: direct ran at 10,000, 20,000 and 15,000/s in its three
    // rounds, and the kernel path beside each at 0.95×, 0.95× and 0.80× of it. The
    // ratio of the medians (12,000 over 15,000) would say 0.80×, the one bad round.
    let mut r = Results::default();
    for t in kernel_targets() {
        let rps: &[f64] = match t.name {
            DIRECT => &[10_000.0, 20_000.0, 15_000.0],
            KERNEL_V1 => &[9_500.0, 19_000.0, 12_000.0],
            _ => &[5_000.0, 5_000.0, 5_000.0],
        };
        r.rate_kernel.push(rounds(&t, rps));
    }
    let mut out = String::new();
    kernel_rows(&r, &mut out);
    let row = out.lines().next().unwrap_or_default();
    assert!(
        row.starts_with("| new connections/s, **kernel path**, PROXY v1 | 12000 (9500–19000) | direct: 15000 (10000–20000);")
            && row.ends_with("| 0.95× [0.80–0.95] | ≥ 0.95× direct | **met** |"),
        "{out}"
    );
    // A case that lost a round cannot be paired: the ratio of the medians.
    assert_eq!(
        compare(&[9.0, 19.0], &[10.0, 20.0, 15.0]).map(|q| (q.median, q.n)),
        Some((14.0 / 15.0, 1))
    );
    // A round without a figure is left out, not counted as zero.
    assert_eq!(
        compare(&[9.0, 1.0], &[10.0, 0.0]).map(|q| (q.median, q.n)),
        Some((0.9, 1))
    );
}

#[test]
fn the_kernel_path_rows_compare_with_direct_and_haproxy_from_their_own_rounds() {
    let mut r = Results::default();
    for t in kernel_targets() {
        let (rps, p99) = match t.name {
            DIRECT => (10_000.0, 1_000.0),
            KERNEL_V1 => (9_500.0, 1_050.0),
            KERNEL_V2 => (8_000.0, 1_500.0),
            _ => (5_000.0, 2_000.0),
        };
        r.rate_kernel.push(runs(&t, rps, p99));
        if !t.name.contains("v2") {
            let direct = t.name == DIRECT;
            r.bulk_kernel
                .push(transfers(&t, if direct { 1000.0 } else { 950.0 }, 600.0));
            r.upload_kernel
                .push(transfers(&t, if direct { 1000.0 } else { 850.0 }, 700.0));
        }
    }
    r.kernel_programs.push(ProgramRuns {
        target: KERNEL_V1,
        program: "hairpin_sockops".into(),
        ns_per_run: vec![700.0],
        runs_per_request: vec![3.0],
        verified_insns: None,
    });
    r.kernel_programs_total.push(ProgramsTotal {
        target: KERNEL_V1,
        ns_per_request: vec![2_300.0, 2_100.0, 2_500.0],
    });
    let mut out = String::new();
    kernel_rows(&r, &mut out);
    program_rows(&r, &mut out);
    let mut rows: Vec<&str> = out.lines().collect();
    assert_eq!(rows.len(), 12, "{out}");
    assert_eq!(
        rows.remove(7),
        "| machine CPU per MB, bulk download, **kernel path** (µs, all CPUs) | 600 | direct: 600; HAProxy: 600 | 1.00× | — | reported |"
    );
    assert_eq!(
        rows.remove(8),
        "| machine CPU per MB, bulk upload, **kernel path** (µs, all CPUs) | 700 | direct: 700; HAProxy: 700 | 1.00× | — | reported |"
    );
    assert_eq!(
        rows.remove(8),
        "| the programs' total run time per connection (Σ ns per run × runs per request, kernel BPF stats), hairpin kernel path, PROXY v1, ns | 2300 (2100–2500) | before the work to halve it: 4600 (the developers' machine) | 0.50× | ≤ 2300 | **met** |"
    );
    // 1e6/rps * 0.9 µs per request: direct 90, kernel v1 94.7, HAProxy 180.
    assert_eq!(
        rows.remove(2),
        "| machine CPU per request, **kernel path**, PROXY v1 (µs, all CPUs) | 94.7 | direct: 90.0; HAProxy send-proxy: 180.0 (kernel/HAProxy 0.53×) | 1.05× | ≤ 1.04× direct | **missed** |"
    );
    assert!(
        rows.remove(4).ends_with("| 112.5 | direct: 90.0; HAProxy send-proxy-v2: 180.0 (kernel/HAProxy 0.62×) | 1.25× | ≤ 1.04× direct | **missed** |"),
        "{out}"
    );
    // Each row: how it starts (after its label) and how it ends.
    let want = [
        (
            "| new connections/s, **kernel path**, PROXY v1 | 9500 ",
            "| 0.95× | ≥ 0.95× direct | **met** |",
        ),
        ("", "| 1.05× | ≤ 1.10× direct | **met** |"),
        ("", "| 0.80× | ≥ 0.95× direct | **missed** |"),
        ("", "| 1.50× | ≤ 1.10× direct | **missed** |"),
        (
            "| bulk download, **kernel path** (MB/s) | 950 ",
            "| 0.95× | ≥ 0.95× direct | **met** |",
        ),
        (
            "| bulk upload, **kernel path** (MB/s) | 850 ",
            "| 0.85× | ≥ 0.95× direct | **missed** |",
        ),
        (
            "| `hairpin_sockops` program's own run time (kernel BPF stats), hairpin kernel path, PROXY v1, ns per run | 700 ",
            "| runs per request: 3.00; instructions the verifier processed loading it: — | — | ≤ 2 runs per request | **missed** |",
        ),
    ];
    for (row, (start, end)) in rows.iter().zip(want) {
        assert!(row.starts_with(start) && row.ends_with(end), "{row}\n{out}");
    }
    assert!(rows[0].contains("kernel/HAProxy 1.90×"), "{out}");
    // The detail table: per CPU, busy share of the unstolen time, stolen share.
    let mut detail_out = String::new();
    detail::detail(&r, &mut detail_out);
    assert!(
        detail_out.contains("### Machine CPU per request, every target, kernel path run")
            && detail_out.contains(&format!("| {DIRECT} | 90.0 | 45.0 | 45.0 | 5 | 5 | 10.0 |")),
        "{detail_out}"
    );
    assert!(!detail_out.contains("relay run"), "{detail_out}");
    assert!(
        detail_out.contains(&format!("| {KERNEL_V1} | 950 | — | 600 |")),
        "{detail_out}"
    );
    // Without a kernel path run there are no rows.
    let mut none = String::new();
    kernel_rows(&Results::default(), &mut none);
    assert!(none.is_empty());
}

#[test]
fn the_sections_measured_elsewhere_survive_a_new_report() {
    let old = format!(
        "# hairpin benchmarks\n\nold table\n\n{KEPT_MARKER}\n## Real cluster\n\n| a | b |\n"
    );
    assert_eq!(
        kept_sections(&old),
        format!("{KEPT_MARKER}\n## Real cluster\n\n| a | b |\n")
    );
    assert_eq!(kept_sections("# hairpin benchmarks\n\nold table\n"), "");
}
