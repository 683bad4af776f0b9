#!/usr/bin/env bash
# ep_netns.sh — dp_netns.sh with expert parallelism (P = 2): the two ranks
# in two network namespaces, tokens crossing the veth by all-to-all; the
# cut, the pause naming the node, the resume, the one-rank losses.
NETNS_EP=1 exec bash "$(dirname "$0")/dp_netns.sh" "$@"
