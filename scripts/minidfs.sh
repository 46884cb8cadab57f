#!/usr/bin/env bash
# An HDFS for tests and scripts/cluster: a MiniDFSCluster (name node and data
# nodes in one JVM, Hadoop's own test cluster) built from tools/minidfs with
# Maven on the installed Java.
#
#   scripts/minidfs.sh --build                    fetch Hadoop's artifacts and build (once)
#   scripts/minidfs.sh BASE_DIR [PORT [DATANODES [HOST [external]]]]
#   scripts/minidfs.sh --datanode DIR NAMENODE_HOST:PORT IP
#
# The second form prints "ready hdfs://HOST:PORT" once clients can connect
# (PORT 0: a free one; HOST, default 127.0.0.1, the address clients reach it
# at: scripts/cluster gives its bridge's) and runs until killed or until its
# standard input closes. With "external" it starts the name node alone,
# prints "namenode HOST:PORT http=HOST:PORT" (WebHDFS), and waits for
# DATANODES data nodes of the third form (one per node's network namespace
# in scripts/cluster; replication 1) before "ready".
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tool="$root/tools/minidfs"
jar="$tool/target/minidfs-1.jar"
classpath="$tool/target/classpath.txt"

build() {
  if [ ! -f "$jar" ] || [ ! -f "$classpath" ] \
     || [ "$tool/pom.xml" -nt "$classpath" ] \
     || [ "$tool/src/main/java/cirro/MiniDfs.java" -nt "$jar" ]; then
    (cd "$tool" && mvn -q -B package dependency:build-classpath -Dmdep.outputFile=target/classpath.txt) >&2
  fi
}

if [ "${1:-}" = "--build" ]; then
  build
  exit 0
fi
if [ $# -lt 1 ]; then
  sed -n '2,16p' "$0" >&2
  exit 2
fi
build
if [ "$1" = "--datanode" ]; then
  exec java -Xmx256m -cp "$jar:$(cat "$classpath")" cirro.MiniDfs "$@"
fi
exec java -Xmx512m -cp "$jar:$(cat "$classpath")" cirro.MiniDfs "$1" "${2:-0}" "${3:-1}" "${4:-127.0.0.1}" ${5:+"$5"}
