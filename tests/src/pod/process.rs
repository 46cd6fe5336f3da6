//! The pod's agent process, started through `hairpin-pod`, and its end.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use super::launch::Launch;

/// The container's process; SIGKILLed on drop if still running (its mount namespace,
/// and every mount made for it, goes with it).
pub struct PodProcess {
    child: Option<Child>,
    /// Its stderr.
    pub log: PathBuf,
    /// Its stdout.
    pub out: PathBuf,
}

impl PodProcess {
    /// Starts `launch` through `helper` (the `hairpin-pod` binary), stderr to `log`,
    /// stdout beside it (`.out`).
    pub fn start(helper: &Path, launch: &Launch, dir: &Path, log: PathBuf) -> PodProcess {
        let spec = dir.join(format!(
            "launch-{}.json",
            log.file_stem().and_then(|s| s.to_str()).unwrap_or("pod")
        ));
        fs::write(&spec, launch.to_json()).expect("write launch spec");
        let out = log.with_extension("out");
        let child = std::process::Command::new(helper)
            .arg(&spec)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(fs::File::create(&out).expect("pod stdout"))
            .stderr(fs::File::create(&log).expect("pod log"))
            .spawn()
            .expect("start hairpin-pod");
        PodProcess {
            child: Some(child),
            log,
            out,
        }
    }

    /// Its stdout so far.
    pub fn stdout(&self) -> String {
        fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Its output so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `needle`; panics with the log if it does not
    /// within `within` or the process exits first.
    pub fn wait_for_log(&mut self, needle: &str, within: Duration) {
        crate::agent::wait_for_log_of(
            "the pod's process",
            &self.log,
            self.child.as_mut(),
            needle,
            within,
        );
    }

    /// Waits for it to exit, at most `within`; its exit code.
    pub fn wait(&mut self, within: Duration) -> i32 {
        let deadline = Instant::now() + within;
        let child = self.child.as_mut().expect("running");
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                self.child = None;
                return status.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < deadline,
                "still running after {within:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }
}

impl Drop for PodProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
