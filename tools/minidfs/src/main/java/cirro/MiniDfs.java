package cirro;

import java.io.File;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

/**
 * Starts a MiniDFSCluster: {@code MiniDfs BASE_DIR NAMENODE_PORT DATANODES [HOST [external]]}.
 * Prints {@code ready hdfs://HOST:PORT} once it accepts clients, then runs
 * until killed or until standard input closes.
 *
 * <p>With {@code external}, the name node starts alone (replication 1),
 * prints {@code namenode HOST:PORT http=HOST:HTTP_PORT} and waits for
 * DATANODES data nodes started apart, each by
 * {@code MiniDfs --datanode DIR NAMENODE_HOST:PORT IP} (scripts/cluster runs
 * one in every node's network namespace: a block written by a node lands on
 * its own data node, as HDFS writes the first replica on the writer's host).
 *
 * <p>HOST (default 127.0.0.1) is the address clients reach the name node and
 * the data nodes at. MiniDFSCluster binds everything to 127.0.0.1; for
 * another HOST (scripts/cluster's bridge, reached from the nodes' network
 * namespaces) the name node also listens on all addresses and the data
 * nodes are started connecting to it at HOST: the name node records a data
 * node's address as the one it connected from, and hands it to clients.
 */
public final class MiniDfs {
  public static void main(String[] args) throws Exception {
    if (args.length > 0 && args[0].equals("--datanode")) {
      dataNode(new File(args[1]).getAbsoluteFile(), args[2], args[3]);
      return;
    }
    File base = new File(args[0]).getAbsoluteFile();
    int port = Integer.parseInt(args[1]);
    int dataNodes = args.length > 2 ? Integer.parseInt(args[2]) : 1;
    String host = args.length > 3 ? args[3] : "127.0.0.1";
    boolean exposed = !host.equals("127.0.0.1");
    boolean external = args.length > 4 && args[4].equals("external");
    Configuration conf = new Configuration();
    conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, base.getPath());
    conf.setBoolean("dfs.permissions.enabled", false);
    // Small blocks: a test's files span several, as large tables do.
    conf.setLong("dfs.blocksize", 4L * 1024 * 1024);
    conf.set("dfs.namenode.fs-limits.min-block-size", "1048576");
    if (exposed) {
      conf.set("dfs.namenode.rpc-bind-host", "0.0.0.0");
      // WebHDFS (block locations for Cirro's task placement) on the bridge too.
      conf.set("dfs.namenode.http-bind-host", "0.0.0.0");
      // Data nodes in namespaces have addresses without host names.
      conf.setBoolean("dfs.namenode.datanode.registration.ip-hostname-check", false);
    }
    MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf)
        .nameNodePort(port)
        .numDataNodes(exposed ? 0 : dataNodes)
        .build();
    if (external) {
      cluster.getConfiguration(0).setInt("dfs.replication", 1);
      cluster.restartNameNode(true);
      System.out.println("namenode " + host + ":" + cluster.getNameNodePort()
          + " http=" + host + ":" + cluster.getNameNode(0).getHttpAddress().getPort());
      System.out.flush();
      for (int waited = 0; cluster.getNamesystem().getNumLiveDataNodes() < dataNodes; waited++) {
        if (waited >= 600) {
          throw new IllegalStateException("the data nodes did not register");
        }
        Thread.sleep(500);
      }
    } else if (exposed) {
      // Built without data nodes, the name node's default replication is 0
      // (MiniDFSCluster caps it by the data nodes): set it and restart.
      cluster.getConfiguration(0).setInt("dfs.replication", Math.min(3, dataNodes));
      cluster.restartNameNode(true);
      Configuration dn = new Configuration(conf);
      dn.setInt("dfs.replication", Math.min(3, dataNodes));
      String nameNode = host + ":" + cluster.getNameNodePort();
      dn.set("fs.defaultFS", "hdfs://" + nameNode);
      dn.set("dfs.namenode.rpc-address", nameNode);
      dn.set("dfs.datanode.address", "0.0.0.0:0");
      dn.set("dfs.datanode.http.address", "0.0.0.0:0");
      dn.set("dfs.datanode.ipc.address", "0.0.0.0:0");
      cluster.startDataNodes(dn, dataNodes, true, null, null, null, null, false, true);
    }
    if (!external) {
      // (Not with external data nodes: waitActive counts only its own.)
      cluster.waitActive();
      // Ready means a client can write: the data nodes' first block reports
      // must have reached the name node (until then it has nowhere to place a
      // block), which a loaded machine can delay past waitActive().
      cluster.waitFirstBRCompleted(0, 60000);
    }
    org.apache.hadoop.fs.FileSystem fs = cluster.getFileSystem();
    org.apache.hadoop.fs.Path probe = new org.apache.hadoop.fs.Path("/.minidfs-probe");
    for (int attempt = 0; ; attempt++) {
      try (org.apache.hadoop.fs.FSDataOutputStream out = fs.create(probe, true)) {
        out.write(1);
        break;
      } catch (java.io.IOException e) {
        if (attempt >= 120) {
          throw e;
        }
        Thread.sleep(500);
      }
    }
    fs.delete(probe, false);
    System.out.println("ready hdfs://" + host + ":" + cluster.getNameNodePort());
    System.out.flush();
    Runtime.getRuntime().addShutdownHook(new Thread(cluster::shutdown));
    while (System.in.read() != -1) {
      // the parent holds standard input open while it wants the cluster
    }
    cluster.shutdown();
    System.exit(0);
  }

  /**
   * One data node in this process, storing under DIR, registering with the
   * name node at NAMENODE and serving blocks at IP (its network namespace's
   * address, which the name node hands to clients).
   */
  private static void dataNode(File dir, String nameNode, String ip) throws Exception {
    Configuration conf = new org.apache.hadoop.hdfs.HdfsConfiguration();
    conf.set("fs.defaultFS", "hdfs://" + nameNode);
    conf.set("dfs.namenode.rpc-address", nameNode);
    conf.set("dfs.datanode.data.dir", new File(dir, "data").getPath());
    conf.set("dfs.datanode.address", ip + ":0");
    conf.set("dfs.datanode.http.address", ip + ":0");
    conf.set("dfs.datanode.ipc.address", ip + ":0");
    conf.set("dfs.datanode.hostname", ip);
    conf.setBoolean("dfs.permissions.enabled", false);
    org.apache.hadoop.hdfs.server.datanode.DataNode node =
        org.apache.hadoop.hdfs.server.datanode.DataNode.createDataNode(new String[0], conf);
    System.out.println("ready datanode " + ip + ":" + node.getXferPort());
    System.out.flush();
    Runtime.getRuntime().addShutdownHook(new Thread(node::shutdown));
    while (System.in.read() != -1) {
      // the parent holds standard input open while it wants the data node
    }
    node.shutdown();
    System.exit(0);
  }
}
