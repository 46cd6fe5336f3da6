//! Whether this process may build namespaces and attach BPF programs.

/// Returns true when the datapath tests can run. Off CI, a non-root run skips loudly;
/// on CI (CI=true) a missing privilege fails the test instead of skipping it.
pub fn datapath_tests_can_run(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    if root {
        return true;
    }
    if ci {
        panic!("{test}: the datapath tests need root (CI=true, so this is a failure, not a skip)");
    }
    eprintln!("SKIPPED {test}: needs root to create network namespaces, cgroups and attach BPF");
    false
}

/// Returns from the calling test unless [`datapath_tests_can_run`]: off CI, a
/// non-root run skips loudly; with `CI=true` it fails instead.
#[macro_export]
macro_rules! require_privileges {
    () => {
        if !$crate::privileges::datapath_tests_can_run(module_path!()) {
            return;
        }
    };
}
