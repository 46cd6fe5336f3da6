//! The container's seccomp filter: a profile resolved for its capabilities and this
//! machine's architecture as containerd's `DefaultProfile` resolves it, compiled.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

/// One rule of a resolved seccomp profile.
#[derive(Clone, Debug, PartialEq)]
pub struct SeccompRule {
    /// Syscall names.
    pub names: Vec<String>,
    /// `None` to allow, `Some(errno)` to fail with it.
    pub errno: Option<u32>,
    /// (index, op, value, valueTwo); all must hold.
    pub args: Vec<(u8, String, u64, u64)>,
}

/// A profile resolved for one container: the errno of the default action and the rules.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// `defaultErrnoRet` (EPERM when absent).
    pub default_errno: u32,
    /// The rules that apply.
    pub rules: Vec<SeccompRule>,
}

impl Resolved {
    /// The names allowed unconditionally by some rule.
    pub fn allowed(&self) -> BTreeSet<String> {
        self.rules
            .iter()
            .filter(|r| r.errno.is_none() && r.args.is_empty())
            .flat_map(|r| r.names.iter().cloned())
            .collect()
    }
}

/// This machine's architecture in Go's GOARCH names (the profiles' `arches`).
pub fn goarch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => panic!("no seccomp filter for {other} here"),
    }
}

/// The running kernel's (major, minor).
pub fn kernel() -> (u32, u32) {
    let u = nix::sys::utsname::uname().expect("uname");
    let r = u.release().to_string_lossy().into_owned();
    let mut it = r.split(|c: char| !c.is_ascii_digit());
    let mut n = || it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    (n(), n())
}

/// Resolves `profile` (the JSON of `tests/fixtures/seccomp/` with `includes` and
/// `excludes`, or an OCI profile without them) for a container whose bounding set is
/// `caps`, on `arch` (GOARCH) and `kernel`, as containerd's DefaultProfile decides
/// which rules to append.
pub fn resolve_profile(
    profile: &Value,
    caps: &[String],
    arch: &str,
    kernel: (u32, u32),
) -> Resolved {
    assert_eq!(profile["defaultAction"], "SCMP_ACT_ERRNO", "default action");
    let list = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let has_cap = |v: &Value| list(v).iter().any(|c| caps.contains(c));
    let mut rules = Vec::new();
    for r in profile["syscalls"].as_array().expect("syscalls") {
        let (inc, exc) = (&r["includes"], &r["excludes"]);
        if inc["caps"].is_array() && !has_cap(&inc["caps"]) {
            continue;
        }
        if inc["arches"].is_array() && !list(&inc["arches"]).iter().any(|a| a == arch) {
            continue;
        }
        if let Some(min) = inc["minKernel"].as_str() {
            let mut it = min.split('.').map(|n| n.parse::<u32>().expect("minKernel"));
            let want = (it.next().unwrap_or(0), it.next().unwrap_or(0));
            if kernel < want {
                continue;
            }
        }
        if has_cap(&exc["caps"]) || list(&exc["arches"]).iter().any(|a| a == arch) {
            continue;
        }
        let errno = match r["action"].as_str().expect("action") {
            "SCMP_ACT_ALLOW" => None,
            "SCMP_ACT_ERRNO" => Some(r["errnoRet"].as_u64().unwrap_or(1) as u32),
            other => panic!("action {other} is not simulated"),
        };
        let args = r["args"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|a| {
                        (
                            a["index"].as_u64().expect("index") as u8,
                            a["op"].as_str().expect("op").to_string(),
                            a["value"].as_u64().expect("value"),
                            a["valueTwo"].as_u64().unwrap_or(0),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        rules.push(SeccompRule {
            names: list(&r["names"]),
            errno,
            args,
        });
    }
    Resolved {
        default_errno: profile["defaultErrnoRet"].as_u64().unwrap_or(1) as u32,
        rules,
    }
}

fn target_arch() -> seccompiler::TargetArch {
    seccompiler::TargetArch::try_from(std::env::consts::ARCH).expect("seccompiler arch")
}

/// Whether seccompiler's syscall table has `name` on this architecture. runc skips
/// names libseccomp cannot resolve (syscalls of newer kernels or other
/// architectures); so does this.
fn known_syscall(name: &str) -> bool {
    // (seccompiler refuses a filter whose two actions are the same.)
    let probe = json!({"p": {"mismatch_action": "allow", "match_action": {"errno": 1},
                             "filter": [{"syscall": name}]}});
    seccompiler::compile_from_json(probe.to_string().as_bytes(), target_arch()).is_ok()
}

/// BPF programs equivalent to `resolved`, to install in order. One filter holds the
/// allow rules with the default errno on every other call; one more per errno action
/// (clone3's ENOSYS) fails its calls with that errno and allows the rest. The kernel
/// runs every installed filter and takes the most restrictive answer, and of two
/// errno answers the later filter's, so the stack decides as the single filter runc
/// builds does.
pub fn compile_filters(resolved: &Resolved) -> Vec<seccompiler::BpfProgram> {
    let cond = |(index, op, value, two): &(u8, String, u64, u64)| -> Value {
        let (op, val) = match op.as_str() {
            "SCMP_CMP_EQ" => (json!("eq"), *value),
            "SCMP_CMP_NE" => (json!("ne"), *value),
            "SCMP_CMP_LT" => (json!("lt"), *value),
            "SCMP_CMP_LE" => (json!("le"), *value),
            "SCMP_CMP_GT" => (json!("gt"), *value),
            "SCMP_CMP_GE" => (json!("ge"), *value),
            // OCI: (arg & value) == valueTwo.
            "SCMP_CMP_MASKED_EQ" => (json!({"masked_eq": value}), *two),
            other => panic!("seccomp op {other} is not simulated"),
        };
        json!({"index": index, "type": "qword", "op": op, "val": val})
    };
    let mut groups: BTreeMap<Option<u32>, Vec<&SeccompRule>> = BTreeMap::new();
    for r in &resolved.rules {
        groups.entry(r.errno).or_default().push(r);
    }
    let mut known = BTreeMap::new();
    let mut programs = Vec::new();
    for (errno, rules) in groups {
        // A name allowed without conditions anywhere in the group needs no conditions.
        let bare: BTreeSet<&str> = rules
            .iter()
            .filter(|r| r.args.is_empty())
            .flat_map(|r| r.names.iter().map(String::as_str))
            .collect();
        let mut filter = Vec::new();
        for r in rules {
            for name in &r.names {
                if !*known
                    .entry(name.clone())
                    .or_insert_with(|| known_syscall(name))
                {
                    continue;
                }
                if r.args.is_empty() {
                    filter.push(json!({"syscall": name}));
                } else if !bare.contains(name.as_str()) {
                    let args: Vec<Value> = r.args.iter().map(cond).collect();
                    filter.push(json!({"syscall": name, "args": args}));
                }
            }
        }
        assert!(
            errno.is_some() || filter.len() > 100,
            "only {} of the profile's allow rules are known syscalls here",
            filter.len()
        );
        let (mismatch, matched) = match errno {
            None => (json!({"errno": resolved.default_errno}), json!("allow")),
            Some(e) => (json!("allow"), json!({"errno": e})),
        };
        let doc = json!({"f": {"mismatch_action": mismatch, "match_action": matched,
                               "filter": filter}});
        let mut map = seccompiler::compile_from_json(doc.to_string().as_bytes(), target_arch())
            .unwrap_or_else(|e| panic!("compile the seccomp filter: {e}"));
        // Allow first: the errno filters installed after it answer for their calls.
        let p = map.remove("f").expect("filter f");
        if errno.is_none() {
            programs.insert(0, p);
        } else {
            programs.push(p);
        }
    }
    programs
}
