package cirro;

import java.io.File;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

/**
 * Starts a MiniDFSCluster: {@code MiniDfs BASE_DIR NAMENODE_PORT DATANODES}.
 * Prints {@code ready hdfs://127.0.0.1:PORT} once it accepts clients, then
 * runs until killed or until standard input closes.
 */
public final class MiniDfs {
  public static void main(String[] args) throws Exception {
    File base = new File(args[0]).getAbsoluteFile();
    int port = Integer.parseInt(args[1]);
    int dataNodes = args.length > 2 ? Integer.parseInt(args[2]) : 1;
    Configuration conf = new Configuration();
    conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, base.getPath());
    conf.setBoolean("dfs.permissions.enabled", false);
    // Small blocks: a test's files span several, as large tables do.
    conf.setLong("dfs.blocksize", 4L * 1024 * 1024);
    conf.set("dfs.namenode.fs-limits.min-block-size", "1048576");
    MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf)
        .nameNodePort(port)
        .numDataNodes(dataNodes)
        .build();
    cluster.waitActive();
    System.out.println("ready hdfs://127.0.0.1:" + cluster.getNameNodePort());
    System.out.flush();
    Runtime.getRuntime().addShutdownHook(new Thread(cluster::shutdown));
    while (System.in.read() != -1) {
      // the parent holds standard input open while it wants the cluster
    }
    cluster.shutdown();
    System.exit(0);
  }
}
