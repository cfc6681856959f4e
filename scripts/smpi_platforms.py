#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""smpi_platforms.py: SimGrid platform files for scripts/smpi.sh, and the host file that places
P ranks on each.

  smpi_platforms.py --out DIR [--platform NAME --np P [--speedup S] [--bed-link LAT,BW]]

Without --platform, writes every platform for P = 256 and prints their paths. With it, writes
DIR/NAME-P[-xS].xml and DIR/NAME-P.hosts and prints both paths, one per line. --speedup S
divides nothing on the network: it makes the hosts S times faster than scripts/smpi.sh's
host-speed, so that SMPI charges each rank's measured compute divided by S. --bed-link gives
the bed's links a latency of LAT seconds and BW bytes/s each, as fitted on the emulated cluster
(scripts/smpi.sh calibrate), instead of its nominal figures.

The platforms (every figure, and where it comes from, is also written into the file):
  daint     Piz Daint (Cray XC50, the paper's machine): one P100 per node, Aries dragonfly.
  fattree   a two-level non-blocking InfiniBand EDR fat tree, one rank per node.
  gpunodes  nodes of 4 GPUs, all-to-all NVLink inside the node, 4 NICs of 25 GB/s each
            between nodes (as NERSC's Perlmutter; scripts/alphabeta.py's perlmutter profile).
  bed       the emulated cluster of scripts/netbench.sh at its default rate: one host per
            rank, each with one 1 Gbit/s link to a switch.
"""

import argparse
import math
import os
import sys

# The speed scripts/smpi.sh gives SMPI for the machine it runs on (smpi/host-speed): a host of
# the platform with this speed is charged the measured compute seconds 1:1.
HOST_SPEED_FLOPS = 1e9

HEADER = """<?xml version='1.0'?>
<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">
<platform version="4.1">
<!--
{notes}
-->
"""

DAINT_NOTES = """Piz Daint, Cray XC50: one NVIDIA P100 per node, Cray Aries network (dragonfly).
Shape (Alverson, Froese, Kaplan, Roweth, "Cray XC Series Network", Cray 2012): an Aries router
serves 4 nodes; 16 routers form a chassis and are linked all-to-all (one link per pair); 6
chassis form a group, each router linked to its peer in every other chassis of the group by 3
links; groups are linked by optical links. SimGrid's DRAGONFLY topology takes exactly this
shape: topo_parameters = "groups,links between two groups; 6,3; 16,1; 4".
Link figures: 10 GB/s and 0.25 us per link. 10 GB/s is a node's injection bandwidth on Aries
(the figure scripts/alphabeta.py's aries profile uses); Aries' own electrical links carry
5.25 GB/s and its optical links 4.7 GB/s each way, so where a path crosses one router link
this platform is up to 2x optimistic there. 0.25 us per link makes the 4 links of a route
inside a group 1 us, Aries' small-message MPI latency (about 1 to 1.5 us).
Groups: 4, with 8 links between every two groups (an assumption: Piz Daint's groups have
more optical links, spread over more groups than a job sees). The host file puts a job's
ranks on whole routers (4 nodes) dealt round-robin over the groups, as a job's nodes are
spread over a busy machine, so that a job of any size crosses the global links."""

FATTREE_NOTES = """A two-level non-blocking fat tree of InfiniBand EDR (100 Gbit/s = 12.5 GB/s each
way per link; the figure scripts/alphabeta.py's ib100 profile uses), one rank per node.
Leaf switches of 16 nodes, each leaf linked once to each of 16 spine switches (full bisection
bandwidth), in SimGrid's FAT_TREE topology: "2;16,LEAVES;1,16;1,1".
Latency: 0.25 us per link, so 1 us across the spine (4 links) and 0.5 us inside a leaf; an
EDR switch adds about 0.1 us and an MPI message about 1 us end to end."""

GPUNODES_NOTES = """Nodes of 4 GPUs, the shape of NERSC's Perlmutter GPU nodes (NERSC, "Perlmutter
Architecture"; the same figures as scripts/alphabeta.py's perlmutter profile):
- inside a node the 4 GPUs are linked all-to-all by NVLink 3 (4 links of 25 GB/s each way per
  pair of A100s: 100 GB/s per pair, 300 GB/s per GPU to its 3 peers). SimGrid's cluster gives
  each host one private link to the node's router, so each GPU has one link of 300 GB/s: a
  single pair can reach 300 GB/s here, 3x the 100 GB/s of its NVLinks (optimistic for one
  pair, right for a GPU sending to its 3 peers at once).
- between nodes, each node has 4 HPE Slingshot-11 NICs of 25 GB/s (200 Gbit/s) each: one link
  of 100 GB/s from the node's router to the network. One GPU alone can use all 100 GB/s here
  (on the machine its traffic leaves by its own NIC, 25 GB/s): optimistic when only one GPU
  of a node sends off the node.
- the network between nodes is one non-blocking switch (Slingshot's dragonfly is not
  modelled).
- latency: 1 us on each of a route's links inside the node and 1 us for the NICs, so 2 us
  inside a node and 3 us between nodes (alphabeta.py's perlmutter profile takes 2 us for
  either, an assumption there too)."""

BED_NOTES = """The emulated cluster of scripts/netbench.sh at its default --rate 1gbit: each host a
network namespace whose veth pair to a bridge is shaped both ways by tc tbf at 1 Gbit/s
(125 MB/s each way), one rank per host. Latency: 25 us per link, 50 us host to host, an
assumption (veth and a bridge add a few microseconds; the kernel's TCP stack and the tbf's
burst the rest)."""

SPEEDUP_NOTE = """The hosts' speed is {speed} flop/s, {speedup}x scripts/smpi.sh's host-speed: SMPI charges
each rank's compute, measured on the machine that runs the simulation, divided by {speedup}."""


def speed(speedup):
    return f"{HOST_SPEED_FLOPS * speedup:.6g}f"


def daint(P, speedup):
    groups, per_router = 4, 4
    routers = 16 * 6 * groups
    if P > routers * per_router:
        raise SystemExit(f"smpi_platforms.py: daint has {routers * per_router} nodes, not {P}")
    xml = (f'<zone id="world" routing="Full">\n'
           f'  <cluster id="daint" prefix="nid" suffix="" radical="0-{routers * per_router - 1}"'
           f' speed="{speed(speedup)}" bw="10GBps" lat="0.25us" loopback_bw="100GBps"'
           f' loopback_lat="0" topology="DRAGONFLY" topo_parameters="{groups},8;6,3;16,1;{per_router}"/>\n'
           f'</zone>\n')
    # SimGrid numbers a dragonfly's hosts group by group, chassis, router, node: whole routers
    # dealt round-robin over the groups.
    routers_per_group = 16 * 6
    hosts = []
    for r in range(math.ceil(P / per_router)):
        group, slot = r % groups, r // groups
        first = (group * routers_per_group + slot) * per_router
        hosts += [f"nid{first + i}" for i in range(per_router)]
    return DAINT_NOTES, xml, hosts[:P]


def fattree(P, speedup):
    leaves = max(2, math.ceil(P / 16))
    xml = (f'<zone id="world" routing="Full">\n'
           f'  <cluster id="fattree" prefix="node" suffix="" radical="0-{16 * leaves - 1}"'
           f' speed="{speed(speedup)}" bw="12.5GBps" lat="0.25us" loopback_bw="100GBps"'
           f' loopback_lat="0" topology="FAT_TREE" topo_parameters="2;16,{leaves};1,16;1,1"/>\n'
           f'</zone>\n')
    return FATTREE_NOTES, xml, [f"node{i}" for i in range(P)]


def gpunodes(P, speedup):
    per_node = 4
    nodes = math.ceil(P / per_node)
    lines = ['<zone id="world" routing="Floyd">']
    for i in range(nodes):
        lines.append(f'  <cluster id="node{i}" prefix="node{i}-gpu" suffix="" radical="0-3"'
                     f' speed="{speed(speedup)}" bw="300GBps" lat="1us" bb_bw="1200GBps"'
                     f' bb_lat="0" router_id="node{i}-router"/>')
    lines.append('  <zone id="network" routing="Full"><router id="switch"/></zone>')
    for i in range(nodes):
        lines.append(f'  <link id="node{i}-nics" bandwidth="100GBps" latency="1us"/>')
    for i in range(nodes):
        lines.append(f'  <zoneRoute src="node{i}" dst="network" gw_src="node{i}-router"'
                     f' gw_dst="switch"><link_ctn id="node{i}-nics"/></zoneRoute>')
    lines.append('</zone>')
    hosts = [f"node{i // per_node}-gpu{i % per_node}" for i in range(P)]
    return GPUNODES_NOTES, "\n".join(lines) + "\n", hosts


BED_FITTED_NOTES = """The links' latency and bandwidth are not the nominal figures above: they
were fitted on the emulated cluster itself (scripts/smpi.sh calibrate): {lat:g} s and {bw:g}
bytes/s per link, so {lat2:g} s per message host to host."""


def bed(P, speedup, link=None):
    lat, bw = ("25us", "125MBps") if link is None else (f"{link[0]:.6g}s", f"{link[1]:.6g}Bps")
    notes = BED_NOTES
    if link is not None:
        notes += "\n" + BED_FITTED_NOTES.format(lat=link[0], bw=link[1], lat2=2 * link[0])
    xml = (f'<zone id="world" routing="Full">\n'
           f'  <cluster id="bed" prefix="host" suffix="" radical="0-{max(P, 2) - 1}"'
           f' speed="{speed(speedup)}" bw="{bw}" lat="{lat}" loopback_bw="100GBps"'
           f' loopback_lat="0"/>\n'
           f'</zone>\n')
    return notes, xml, [f"host{i}" for i in range(P)]


PLATFORMS = {"daint": daint, "fattree": fattree, "gpunodes": gpunodes, "bed": bed}


def write(out, name, P, speedup, bed_link=None):
    if bed_link is None:
        notes, body, hosts = PLATFORMS[name](P, speedup)
    else:
        notes, body, hosts = bed(P, speedup, bed_link)
    if speedup != 1:
        notes += "\n" + SPEEDUP_NOTE.format(speed=speed(speedup), speedup=f"{speedup:g}")
    suffix = "" if speedup == 1 else f"-x{speedup:g}"
    if bed_link is not None:
        suffix += f"-lat{bed_link[0]:g}-bw{bed_link[1]:g}"
    xml_path = os.path.join(out, f"{name}-{P}{suffix}.xml")
    hosts_path = os.path.join(out, f"{name}-{P}.hosts")
    with open(xml_path, "w") as f:
        f.write(HEADER.format(notes=notes.replace("--", "- -")) + body + "</platform>\n")
    with open(hosts_path, "w") as f:
        f.write("".join(h + "\n" for h in hosts))
    return xml_path, hosts_path


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for the files (made if missing)")
    p.add_argument("--platform", choices=sorted(PLATFORMS))
    p.add_argument("--np", type=int, default=256, help="ranks (default 256)")
    p.add_argument("--speedup", type=float, default=1.0,
                   help="hosts this many times faster than the simulating machine (default 1)")
    p.add_argument("--bed-link", metavar="LAT,BW",
                   help="the bed's links: latency in s and bandwidth in bytes/s (fitted ones)")
    args = p.parse_args()
    link = None
    if args.bed_link is not None:
        if args.platform != "bed":
            p.error("--bed-link needs --platform bed")
        try:
            link = tuple(float(x) for x in args.bed_link.split(","))
        except ValueError:
            link = ()
        if len(link) != 2 or not all(x > 0 for x in link):
            p.error(f"--bed-link takes LATENCY_S,BANDWIDTH_BPS, both positive, not "
                    f"'{args.bed_link}'")
    if args.np < 1:
        p.error("--np must be at least 1")
    if not args.speedup > 0:
        p.error("--speedup must be positive")
    os.makedirs(args.out, exist_ok=True)
    names = [args.platform] if args.platform else sorted(PLATFORMS)
    for name in names:
        for path in write(args.out, name, args.np, args.speedup, link):
            print(path)


if __name__ == "__main__":
    sys.exit(main())
