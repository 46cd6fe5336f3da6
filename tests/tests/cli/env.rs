//! A misspelt `HAIRPIN_*` variable (the chart's `extraEnv`, a kustomize patch) stops
//! the agent before it does anything, naming the variable and the one it resembles:
//! ignored, it would drop the setting without a word.

/// `hairpin-agent SUBCOMMAND` with `HAIRPIN_LB_CIDR` (for `HAIRPIN_LB_CIDRS`) set:
/// refused with the usage status, the typo and the right name in the message.
#[test]
fn an_unknown_hairpin_variable_stops_the_agent_naming_the_nearest_one() {
    for args in [&["run"][..], &["coredns-writer", "--coredns", "corefile"]] {
        let subcommand = args[0];
        let out = hairpin_tests::agent::agent_command()
            .args(args)
            .env("HAIRPIN_LB_CIDR", "203.0.113.0/24")
            // A Service's links, as the kubelet sets them in the pod: not typos.
            .env("HAIRPIN_SERVICE_HOST", "10.96.0.10")
            .env("HAIRPIN_PORT_80_TCP_ADDR", "10.96.0.10")
            .output()
            .expect("run hairpin-agent");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{subcommand}: {stderr}");
        assert!(
            stderr.contains("environment variable HAIRPIN_LB_CIDR is not one hairpin-agent reads")
                && stderr.contains("did you mean HAIRPIN_LB_CIDRS?"),
            "{subcommand}: {stderr}"
        );
    }
}
