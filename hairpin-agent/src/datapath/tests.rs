use super::*;

#[test]
fn a_full_map_is_told_apart_from_other_insert_failures() {
    let syscall = |errno: nix::errno::Errno| {
        aya::maps::MapError::SyscallError(aya::sys::SyscallError {
            call: "bpf_map_update_elem",
            io_error: std::io::Error::from_raw_os_error(errno as i32),
        })
    };
    assert!(is_full(&syscall(nix::errno::Errno::E2BIG)));
    assert!(!is_full(&syscall(nix::errno::Errno::EPERM)));
    assert!(!is_full(&aya::maps::MapError::KeyNotFound));
    let e = DatapathError::MapFull {
        frontend: "203.0.113.10:443".parse().expect("addr"),
        capacity: 64,
    };
    assert_eq!(
        e.to_string(),
        "the frontend map is full (64 entries, --max-frontends): 203.0.113.10:443 is not \
         proxied and takes the pre-hairpin path"
    );
}
