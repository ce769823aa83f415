#!/bin/sh
# ctrlrun-egress: make the ctrlrun sidecar the only way out of this network namespace.
#
# Run it as root with CAP_NET_ADMIN, once, before the agent starts (the Kubernetes init
# container `ctrlrun-egress`, or compose's `egress` service). Afterwards a connection beyond
# loopback is refused unless the sidecar's UID opens it: an agent that ignores HTTPS_PROXY, or
# unsets it, reaches nothing. What stays open: loopback (the sidecar itself), DNS to the
# resolvers of /etc/resolv.conf, and replies on connections that came in (probes on the admin
# port). Refusals are REJECTs, so a client fails at once instead of hanging.
#
#   CTRLRUN_UID   the sidecar's UID (required, numeric; the image's is 10001)
#   CTRLRUN_MODE  owner (default): only the owner-match rules; the agent uses HTTPS_PROXY.
#                 transparent: also redirect the agent's outbound IPv4 TCP to the sidecar's
#                 transparent listener (`ctrlrun proxy --mode transparent`), so a client that
#                 knows nothing of proxies is guarded. IPv6 TCP is refused, not redirected.
#   CTRLRUN_PORT  the sidecar's listener port (default 8080; transparent mode)
#   CTRLRUN_DNS   resolvers allowed on port 53 (default: the nameservers of /etc/resolv.conf;
#                 "none" for none)
#
# Running it again replaces its own rules (chains CTRLRUN-OUT and CTRLRUN-REDIRECT). Any
# failure exits non-zero, so the pod does not start with half the rules.
set -eu

uid="${CTRLRUN_UID:-}"
mode="${CTRLRUN_MODE:-owner}"
port="${CTRLRUN_PORT:-8080}"
case "$uid" in '' | *[!0-9]*) echo "ctrlrun-egress: CTRLRUN_UID must be the sidecar's numeric UID" >&2; exit 2 ;; esac
case "$port" in '' | *[!0-9]*) echo "ctrlrun-egress: CTRLRUN_PORT must be a port number" >&2; exit 2 ;; esac
case "$mode" in owner | transparent) ;; *) echo "ctrlrun-egress: CTRLRUN_MODE must be owner or transparent, not $mode" >&2; exit 2 ;; esac
if [ -n "${CTRLRUN_DNS+set}" ]; then
  dns="$CTRLRUN_DNS"
else
  dns="$(awk '$1 == "nameserver" {print $2}' /etc/resolv.conf 2>/dev/null || true)"
fi
[ "$dns" = none ] && dns=""

# chain TOOL TABLE NAME HOOK: an empty chain of ours, jumped to first from HOOK.
chain() {
  "$1" -w -t "$2" -N "$3" 2>/dev/null || "$1" -w -t "$2" -F "$3"
  "$1" -w -t "$2" -C "$4" -j "$3" 2>/dev/null || "$1" -w -t "$2" -I "$4" 1 -j "$3"
}

# owner_rules TOOL FAMILY: the filter rules for one address family (4 or 6).
owner_rules() {
  t="$1"
  chain "$t" filter CTRLRUN-OUT OUTPUT
  "$t" -w -A CTRLRUN-OUT -o lo -j ACCEPT
  "$t" -w -A CTRLRUN-OUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
  "$t" -w -A CTRLRUN-OUT -m owner --uid-owner "$uid" -j ACCEPT
  if [ "$2" = 6 ]; then
    # The kernel's own neighbour and router discovery: without it IPv6 reaches no one, the
    # sidecar included. (ARP, its IPv4 twin, is not IP and never meets these rules.)
    for type in router-solicitation neighbour-solicitation neighbour-advertisement; do
      "$t" -w -A CTRLRUN-OUT -p ipv6-icmp --icmpv6-type "$type" -j ACCEPT
    done
  fi
  if [ "$mode" = transparent ] && [ "$2" = 4 ]; then
    # A connection redirected below still names its old interface here: accept it by
    # what NAT made of it, the sidecar's listener.
    "$t" -w -A CTRLRUN-OUT -p tcp -d 127.0.0.1 --dport "$port" -m conntrack --ctstate DNAT -j ACCEPT
  fi
  for server in $dns; do
    case "$server" in *:*) [ "$2" = 6 ] || continue ;; *) [ "$2" = 4 ] || continue ;; esac
    "$t" -w -A CTRLRUN-OUT -d "$server" -p udp --dport 53 -j ACCEPT
    "$t" -w -A CTRLRUN-OUT -d "$server" -p tcp --dport 53 -j ACCEPT
  done
  "$t" -w -A CTRLRUN-OUT -p tcp -j REJECT --reject-with tcp-reset
  "$t" -w -A CTRLRUN-OUT -j REJECT
}

owner_rules iptables 4
# Without IPv6 in the kernel there is nothing to close; with it, a failure must stop us.
if [ -e /proc/net/if_inet6 ]; then
  owner_rules ip6tables 6
fi

if [ "$mode" = transparent ]; then
  # NAT's OUTPUT hook runs before the filter's, which accepts what is redirected here.
  chain iptables nat CTRLRUN-REDIRECT OUTPUT
  iptables -w -t nat -A CTRLRUN-REDIRECT -m owner --uid-owner "$uid" -j RETURN
  iptables -w -t nat -A CTRLRUN-REDIRECT -o lo -j RETURN
  for server in $dns; do
    case "$server" in *:*) continue ;; esac
    iptables -w -t nat -A CTRLRUN-REDIRECT -d "$server" -p tcp --dport 53 -j RETURN
  done
  iptables -w -t nat -A CTRLRUN-REDIRECT -p tcp -j REDIRECT --to-ports "$port"
fi

echo "ctrlrun-egress: only UID $uid may leave this network namespace ($mode mode)"
