import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Redis } from 'ioredis';
import { freePort } from './ports';
import { waitForPing } from './redis-server';

const run = promisify(execFile);

export interface ClusterNodeInfo {
  port: number;
  role: 'master' | 'slave';
  /** For a replica, the port of its primary. */
  primaryPort?: number;
  /** Slot ranges a primary serves, as CLUSTER NODES writes them (`0-5460`). */
  slots: string[];
}

/**
 * A private Redis Cluster on free loopback ports: `primaries` primaries with a replica each, nothing on
 * disk but each node's cluster state in a temporary folder. A node can be killed (SIGKILL); its replica
 * takes over after `nodeTimeoutMs`. `stop` removes every process and the folder.
 */
export async function startRedisCluster(primaries = 3, nodeTimeoutMs = 2000) {
  const dir = await mkdtemp(join(tmpdir(), 'kms-redis-cluster-'));
  const nodes: { port: number; child: ChildProcess }[] = [];
  const stop = async () => {
    await Promise.all(
      nodes.map(async ({ child }) => {
        if (child.exitCode !== null || child.signalCode !== null) return;
        const exited = new Promise((resolve) => child.once('exit', resolve));
        child.kill('SIGKILL');
        await exited;
      }),
    );
    await rm(dir, { recursive: true, force: true });
  };
  try {
    for (let i = 0; i < primaries * 2; i++) {
      const port = await freePort();
      // The cluster bus on a free port of its own (by default port + 10000, past 65535 for high ports).
      const busPort = await freePort();
      const args = [
        '--port',
        String(port),
        '--cluster-port',
        String(busPort),
        '--bind',
        '127.0.0.1',
        '--save',
        '',
        '--appendonly',
        'no',
        '--cluster-enabled',
        'yes',
      ];
      args.push('--cluster-config-file', join(dir, `nodes-${port}.conf`), '--cluster-node-timeout', String(nodeTimeoutMs), '--dir', dir);
      // A replica takes over only once it has synced; by default a diskless sync waits 5 s for more replicas.
      args.push('--repl-diskless-sync-delay', '0');
      nodes.push({ port, child: spawn('redis-server', args, { stdio: 'ignore' }) });
    }
    for (const { port } of nodes) await waitForPing(port);
    await run('redis-cli', ['--cluster', 'create', ...nodes.map((n) => `127.0.0.1:${n.port}`), '--cluster-replicas', '1', '--cluster-yes'], {
      timeout: 30_000,
    });
    const cluster = {
      dir,
      ports: nodes.map((n) => n.port),
      /** REDIS_CLUSTER_NODES for the service. */
      seeds: nodes.map((n) => `127.0.0.1:${n.port}`).join(','),
      /** The cluster as one live node sees it. */
      async layout(): Promise<ClusterNodeInfo[]> {
        const live = nodes.find((n) => n.child.exitCode === null && n.child.signalCode === null)!;
        const probe = new Redis({ port: live.port, host: '127.0.0.1', lazyConnect: true });
        try {
          await probe.connect();
          return parseClusterNodes(String(await probe.call('CLUSTER', 'NODES')));
        } finally {
          probe.disconnect();
        }
      },
      /** SIGKILLs the node on `port`. */
      async kill(port: number) {
        const node = nodes.find((n) => n.port === port)!;
        const exited = new Promise((resolve) => node.child.once('exit', resolve));
        node.child.kill('SIGKILL');
        await exited;
      },
      /**
       * Resolves once every slot is served again by a live primary (`cluster_state:ok` on every live node)
       * and every live replica is in sync with its primary (only a synced replica can take over).
       */
      async waitHealthy(timeoutMs = 30_000) {
        const deadline = Date.now() + timeoutMs;
        for (;;) {
          const states = await Promise.all(nodes.filter((n) => n.child.exitCode === null && n.child.signalCode === null).map((n) => nodeState(n.port)));
          if (states.every((s) => s === 'ok')) return;
          if (Date.now() > deadline) throw new Error(`the Redis Cluster did not recover within ${timeoutMs} ms`);
          await new Promise((r) => setTimeout(r, 100));
        }
      },
      stop,
    };
    await cluster.waitHealthy();
    return cluster;
  } catch (err) {
    await stop();
    throw err;
  }
}

/** `ok` for a node whose cluster is whole and which, if a replica, is in sync with its primary. */
async function nodeState(port: number): Promise<string> {
  const probe = new Redis({ port, host: '127.0.0.1', lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
  probe.on('error', () => undefined);
  try {
    await probe.connect();
    const cluster = /cluster_state:(\w+)/.exec(String(await probe.call('CLUSTER', 'INFO')))?.[1] ?? 'unknown';
    const replication = await probe.info('replication');
    const link = /role:slave/.test(replication) ? (/master_link_status:(\w+)/.exec(replication)?.[1] ?? 'unknown') : 'up';
    return cluster === 'ok' && link === 'up' ? 'ok' : `cluster ${cluster}, replica link ${link}`;
  } catch {
    return 'unreachable';
  } finally {
    probe.disconnect();
  }
}

/** CLUSTER NODES lines: `<id> <ip:port@bus> <flags> <primary id|-> … <slots…>`; failed nodes are left out. */
function parseClusterNodes(text: string): ClusterNodeInfo[] {
  const rows = text
    .trim()
    .split('\n')
    .map((line) => line.split(' '))
    .filter((f) => !f[2].includes('fail') && !f[2].includes('noaddr'));
  const portOf = new Map(rows.map((f) => [f[0], Number(/:(\d+)@/.exec(f[1])![1])]));
  return rows.map((f) => ({
    port: portOf.get(f[0])!,
    role: f[2].includes('master') ? 'master' : 'slave',
    primaryPort: f[3] === '-' ? undefined : portOf.get(f[3]),
    slots: f.slice(8),
  }));
}
