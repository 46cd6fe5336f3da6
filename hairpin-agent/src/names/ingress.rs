//! Hosts of `networking.k8s.io/v1` Ingresses: `spec.rules[].host` and
//! `spec.tls[].hosts[]`, each tied to the Ingress's own `status.loadBalancer.ingress[].ip`.

use std::net::IpAddr;

use k8s_openapi::api::networking::v1::Ingress;

use super::{
    claims::{Claim, NameSkip, NameSkipReason, ObjectId},
    hostname::Hostname,
};

/// The hosts one Ingress names, as claims on its LB IPs, and the values that are
/// not valid hostnames (which never reach a file). Rules without a host (catch-all
/// rules) name nothing and are passed over.
pub(crate) fn ingress_claims(ingress: &Ingress) -> (Vec<Claim>, Vec<NameSkip>) {
    let meta = &ingress.metadata;
    let source = format!(
        "Ingress {}/{}",
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or("")
    );
    let object = ObjectId {
        api_version: "networking.k8s.io/v1".into(),
        kind: "Ingress".into(),
        namespace: meta.namespace.clone().unwrap_or_else(|| "default".into()),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone(),
    };
    let mut skips = Vec::new();
    let lbs = lb_ips(ingress, &source, &object, &mut skips);
    let mut fields: Vec<(String, &str)> = Vec::new();
    if let Some(spec) = &ingress.spec {
        for (i, rule) in spec.rules.iter().flatten().enumerate() {
            if let Some(host) = &rule.host {
                fields.push((format!("spec.rules[{i}].host"), host));
            }
        }
        for (i, tls) in spec.tls.iter().flatten().enumerate() {
            for (j, host) in tls.hosts.iter().flatten().enumerate() {
                fields.push((format!("spec.tls[{i}].hosts[{j}]"), host));
            }
        }
    }
    let mut claims = Vec::new();
    for (field, value) in fields {
        match Hostname::parse(value) {
            Ok(host) => claims.push(Claim {
                created: meta.creation_timestamp.clone(),
                source: source.clone(),
                object: Some(object.clone()),
                field,
                host,
                lbs: lbs.clone(),
            }),
            Err(e) => skips.push(NameSkip {
                reason: NameSkipReason::InvalidHostname,
                message: format!("{source}: {field}: {e}"),
                object: Some(object.clone()),
            }),
        }
    }
    (claims, skips)
}

/// The Ingress's LB IPs, in status order; entries with only a hostname (AWS ELB)
/// are passed over, unparsable IPs reported.
fn lb_ips(
    ingress: &Ingress,
    source: &str,
    object: &ObjectId,
    skips: &mut Vec<NameSkip>,
) -> Vec<IpAddr> {
    let entries = ingress
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    let mut ips = Vec::new();
    for (i, entry) in entries.into_iter().flatten().enumerate() {
        let Some(ip) = &entry.ip else { continue };
        match ip.parse::<IpAddr>() {
            Ok(ip) if !ips.contains(&ip) => ips.push(ip),
            Ok(_) => {}
            Err(_) => skips.push(NameSkip {
                reason: NameSkipReason::NoLoadBalancerIp,
                message: format!(
                    "{source}: status.loadBalancer.ingress[{i}].ip: expected an ip address, got {ip:?}"
                ),
                object: Some(object.clone()),
            }),
        }
    }
    ips
}
