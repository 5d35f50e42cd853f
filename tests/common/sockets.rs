//! A process's TCP connections, read from /proc: shared by the tests and
//! the benchmark (which includes this file by path).

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An IPv4 address seen through an IPv6 socket counts as the IPv4 one.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// An address of `/proc/net/tcp` or `tcp6`: `0100007F:1F90` is
/// 127.0.0.1:8080 (the address in 32-bit words of host byte order, the
/// port as a number).
pub fn proc_net_address(text: &str) -> Option<(IpAddr, u16)> {
    let (address, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let mut bytes = Vec::with_capacity(16);
    for i in (0..address.len()).step_by(8) {
        let word = u32::from_str_radix(address.get(i..i + 8)?, 16).ok()?;
        bytes.extend_from_slice(&word.to_ne_bytes());
    }
    let ip = match bytes.len() {
        4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => return None,
    };
    Some((canonical(ip), port))
}

/// The process's established TCP connections whose remote end `wanted`
/// accepts: its socket inodes (from `/proc/<pid>/fd`) looked up in the
/// `tcp` and `tcp6` tables of its network namespace; an error when its
/// descriptors or both tables cannot be read.
pub fn established(pid: u32, wanted: impl Fn(IpAddr, u16) -> bool) -> std::io::Result<usize> {
    let mut inodes = HashSet::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        // A descriptor closed while being listed is not a connection.
        let Ok(link) = entry.and_then(|e| std::fs::read_link(e.path())) else {
            continue;
        };
        if let Some(inode) = link
            .to_str()
            .and_then(|l| l.strip_prefix("socket:["))
            .and_then(|l| l.strip_suffix(']'))
        {
            inodes.insert(inode.to_string());
        }
    }
    let mut count = 0;
    let mut tables_read = 0;
    for table in ["tcp", "tcp6"] {
        // tcp6 is absent on a kernel without IPv6.
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        tables_read += 1;
        for line in text.lines().skip(1) {
            // sl, local, remote, state, tx:rx queues, timer, retransmits,
            // uid, timeout, inode.
            let fields: Vec<&str> = line.split_whitespace().collect();
            const ESTABLISHED: &str = "01";
            if fields.len() > 9
                && fields[3] == ESTABLISHED
                && inodes.contains(fields[9])
                && proc_net_address(fields[2]).is_some_and(|(ip, port)| wanted(ip, port))
            {
                count += 1;
            }
        }
    }
    // Neither table: the count would be 0 whatever the process holds.
    if tables_read == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("neither /proc/{pid}/net/tcp nor /proc/{pid}/net/tcp6 can be read"),
        ));
    }
    Ok(count)
}
