//! Runs one container the way a container runtime would, as `hairpin_tests::pod`
//! describes, then execs its command: `hairpin-pod LAUNCH.json`. Used by
//! `tests/tests/pod_as_written.rs`; needs root.

fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("usage: hairpin-pod LAUNCH.json");
    let text = std::fs::read_to_string(&path).expect("read the launch spec");
    let launch = hairpin_tests::pod::Launch::from_json(&text);
    let e = hairpin_tests::pod::exec_container(&launch);
    eprintln!("hairpin-pod: {e:#}");
    std::process::exit(127);
}
