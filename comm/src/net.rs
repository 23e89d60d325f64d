//! Which local address a rank binds (and advertises to its peers), chosen
//! as NCCL chooses its socket interface (`NCCL_SOCKET_IFNAME`).
//!
//! With [`SOCKET_IFNAME`] (`RINGCC_SOCKET_IFNAME`) set, it is a
//! comma-separated list of interface-name prefixes (`eth,ib`); a leading
//! `^` turns the list into exclusions (`^docker,lo`), a leading `=` makes
//! the names exact (`=eth0`, `^=docker0`). The address is the first IPv4
//! address (else the first IPv6 one) of the first interface that is up,
//! matches, and has such an address; none is an error naming the
//! variable. Without the variable, the address is the one the kernel would
//! send from toward the peer named (rank 0's store, say), else the first
//! address of the first interface that is up and not a loopback, else
//! 127.0.0.1. Link-local IPv6 addresses (`fe80::/10`) are never chosen:
//! they cannot be used without a scope.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

use crate::error::{Error, Result};

/// The variable that restricts the interfaces ([`bind_ip`]).
pub const SOCKET_IFNAME: &str = "RINGCC_SOCKET_IFNAME";

/// An interface filter as `RINGCC_SOCKET_IFNAME` writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfFilter {
    /// `^`: the names are exclusions.
    exclude: bool,
    /// `=`: the names are exact, not prefixes.
    exact: bool,
    /// The names or prefixes (blank entries dropped).
    names: Vec<String>,
}

impl IfFilter {
    /// Parses `^`, `=` (in that order, as NCCL) and the comma-separated
    /// names.
    pub fn parse(spec: &str) -> IfFilter {
        let spec = spec.trim();
        let (exclude, spec) = match spec.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, spec),
        };
        let (exact, spec) = match spec.strip_prefix('=') {
            Some(rest) => (true, rest),
            None => (false, spec),
        };
        let names = spec
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect();
        IfFilter {
            exclude,
            exact,
            names,
        }
    }

    /// Whether interface `name` passes the filter.
    pub fn matches(&self, name: &str) -> bool {
        let listed = self.names.iter().any(|n| {
            if self.exact {
                name == n
            } else {
                name.starts_with(n.as_str())
            }
        });
        listed != self.exclude
    }
}

/// Whether `ip` can be bound and advertised as it is (not a link-local
/// IPv6 address, which needs a scope).
fn usable(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(_) => true,
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) != 0xfe80,
    }
}

/// The address chosen among `interfaces` (name, address; in the system's
/// order, interfaces that are down already left out): with a filter, the
/// first matching interface's first IPv4 address, else its first IPv6
/// one; without, the same for the first interface with a non-loopback
/// address. `None` when no interface qualifies.
pub fn choose_ip(filter: Option<&IfFilter>, interfaces: &[(String, IpAddr)]) -> Option<IpAddr> {
    let mut seen: Vec<&str> = Vec::new();
    for (name, _) in interfaces {
        if seen.contains(&name.as_str()) {
            continue;
        }
        seen.push(name);
        let qualifies = match filter {
            Some(f) => f.matches(name),
            None => true,
        };
        if !qualifies {
            continue;
        }
        let all: Vec<IpAddr> = interfaces
            .iter()
            .filter(|(n, ip)| n == name && usable(ip))
            .map(|&(_, ip)| ip)
            .filter(|ip| filter.is_some() || !ip.is_loopback())
            .collect();
        if let Some(ip) = all.iter().find(|ip| ip.is_ipv4()).or_else(|| all.first()) {
            return Some(*ip);
        }
    }
    None
}

/// The address this rank binds: see the [module](self) documentation.
/// `toward`: a peer this rank will talk to (rank 0's store), whose route
/// decides when no filter is set.
pub fn bind_ip(toward: Option<SocketAddr>) -> Result<IpAddr> {
    bind_ip_from(std::env::var(SOCKET_IFNAME).ok(), toward)
}

/// [`bind_ip`] with the variable's value given.
fn bind_ip_from(spec: Option<String>, toward: Option<SocketAddr>) -> Result<IpAddr> {
    if let Some(spec) = spec.filter(|s| !s.trim().is_empty()) {
        let filter = IfFilter::parse(&spec);
        let ifs = up_interfaces()?;
        return choose_ip(Some(&filter), &ifs).ok_or_else(|| {
            let mut names: Vec<&str> = ifs.iter().map(|(n, _)| n.as_str()).collect();
            names.dedup();
            Error::Env {
                var: SOCKET_IFNAME.into(),
                reason: format!(
                    "{spec:?} matches no interface that is up and has an address (up: {})",
                    names.join(", ")
                ),
            }
        });
    }
    if let Some(peer) = toward {
        return route_source(peer);
    }
    Ok(choose_ip(None, &up_interfaces()?).unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)))
}

/// The local address the kernel would send from toward `peer`: a UDP
/// socket connected to it (which sends nothing) tells.
fn route_source(peer: SocketAddr) -> Result<IpAddr> {
    let any = match peer {
        SocketAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
        SocketAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
    };
    let io = |call| move |source| Error::Io { call, source };
    let sock = UdpSocket::bind(any).map_err(io("bind (route lookup)"))?;
    sock.connect(peer).map_err(io("connect (route lookup)"))?;
    Ok(sock.local_addr().map_err(io("getsockname"))?.ip())
}

/// Every (interface, address) of the interfaces that are up, in the
/// system's order.
fn up_interfaces() -> Result<Vec<(String, IpAddr)>> {
    use nix::net::if_::InterfaceFlags;
    let list = nix::ifaddrs::getifaddrs().map_err(|e| Error::Io {
        call: "getifaddrs",
        source: e.into(),
    })?;
    Ok(list
        .filter(|ifa| ifa.flags.contains(InterfaceFlags::IFF_UP))
        .filter_map(|ifa| {
            let a = ifa.address?;
            let ip = match (a.as_sockaddr_in(), a.as_sockaddr_in6()) {
                (Some(v4), _) => IpAddr::V4(v4.ip()),
                (None, Some(v6)) => IpAddr::V6(v6.ip()),
                (None, None) => return None,
            };
            Some((ifa.interface_name, ip))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifs(list: &[(&str, &str)]) -> Vec<(String, IpAddr)> {
        list.iter()
            .map(|(n, a)| (n.to_string(), a.parse().unwrap()))
            .collect()
    }

    fn pick(spec: Option<&str>, list: &[(&str, &str)]) -> Option<String> {
        let f = spec.map(IfFilter::parse);
        choose_ip(f.as_ref(), &ifs(list)).map(|ip| ip.to_string())
    }

    const HOST: [(&str, &str); 7] = [
        ("lo", "127.0.0.1"),
        ("lo", "::1"),
        ("docker0", "172.17.0.1"),
        ("eth0", "fe80::1"),
        ("eth0", "2001:db8::5"),
        ("eth0", "10.0.0.5"),
        ("ib0", "192.168.7.5"),
    ];

    #[test]
    fn prefixes_exclusions_and_exact_names() {
        let f = IfFilter::parse("eth,ib");
        assert!(f.matches("eth0") && f.matches("ib1") && !f.matches("docker0"));
        let f = IfFilter::parse("^docker,lo");
        assert!(!f.matches("docker0") && !f.matches("lo") && f.matches("eth0"));
        let f = IfFilter::parse("=eth0");
        assert!(f.matches("eth0") && !f.matches("eth01") && !f.matches("eth"));
        let f = IfFilter::parse("^=eth0");
        assert!(!f.matches("eth0") && f.matches("eth01"));
        let f = IfFilter::parse(" eth , ,ib ");
        assert!(f.matches("ib0") && f.matches("eth2") && !f.matches("lo"));
    }

    #[test]
    fn the_first_matching_interface_gives_its_ipv4_address() {
        assert_eq!(pick(Some("eth"), &HOST).as_deref(), Some("10.0.0.5"));
        assert_eq!(pick(Some("ib,eth"), &HOST).as_deref(), Some("10.0.0.5"));
        assert_eq!(pick(Some("=ib0"), &HOST).as_deref(), Some("192.168.7.5"));
        assert_eq!(pick(Some("^lo,docker"), &HOST).as_deref(), Some("10.0.0.5"));
        assert_eq!(pick(Some("^=docker0"), &HOST).as_deref(), Some("127.0.0.1"));
        assert_eq!(pick(Some("lo"), &HOST).as_deref(), Some("127.0.0.1"));
        assert_eq!(pick(Some("wlan"), &HOST), None);
        assert_eq!(pick(Some("=eth"), &HOST), None);
    }

    #[test]
    fn ipv6_only_when_the_interface_has_no_ipv4_and_never_link_local() {
        let list = [("eth0", "fe80::1"), ("eth0", "2001:db8::5")];
        assert_eq!(pick(Some("eth"), &list).as_deref(), Some("2001:db8::5"));
        assert_eq!(pick(None, &list).as_deref(), Some("2001:db8::5"));
        let list = [("eth0", "fe80::1"), ("eth1", "10.1.1.1")];
        assert_eq!(pick(Some("eth"), &list).as_deref(), Some("10.1.1.1"));
    }

    #[test]
    fn without_a_filter_the_first_non_loopback_interface() {
        assert_eq!(pick(None, &HOST).as_deref(), Some("172.17.0.1"));
        assert_eq!(pick(None, &HOST[..2]), None);
        assert_eq!(pick(None, &[]), None);
    }

    #[test]
    fn toward_a_peer_the_kernel_routes_from_the_matching_address() {
        let ip = bind_ip_from(None, Some("127.0.0.1:9".parse().unwrap())).unwrap();
        assert_eq!(ip, IpAddr::V4(Ipv4Addr::LOCALHOST));
        // Without a peer: some address of this machine (loopback at worst).
        bind_ip_from(None, None).unwrap();
    }

    #[test]
    fn a_filter_matching_nothing_is_an_error_naming_the_variable() {
        let e = bind_ip_from(Some("=no-such-interface-here".into()), None).unwrap_err();
        assert!(matches!(e, Error::Env { .. }), "{e}");
        assert!(e.to_string().contains(SOCKET_IFNAME), "{e}");
    }
}
