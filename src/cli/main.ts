// The dask-pmix command line: `serve` runs the sidecar, `demo` runs the main job end to end.
import { projectVersion } from './version.js';

const USAGE = `usage: dask-pmix <command> [options]

commands:
  serve      run the sidecar (PMIx server, PMI-1/PMI-2 server, REST API)
  demo       run a local Dask cluster, the sidecar, and MPI jobs on its workers
  openapi    print the REST API's OpenAPI document (JSON)
  exec       exec [--setsid] PROGRAM ARGS...: run a plain MPICH / Intel MPI program as a job
             member, with the member's environment from the sidecar (binds PMI_ID, hands MPI PMI_FD)
  --version  print the dask-pmix version and the PMIx library version
  --help     print this help
`;

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  switch (command) {
    case '--version':
    case 'version': {
      const { PmixServer } = await import('../pmix/server.js');
      process.stdout.write(`dask-pmix ${projectVersion()}\nPMIx ${PmixServer.libraryVersion()}\n`);
      return 0;
    }
    case 'serve': {
      const { serve } = await import('./serve.js');
      return serve(rest);
    }
    case 'demo': {
      const { demo } = await import('./demo.js');
      return demo(rest);
    }
    case 'openapi': {
      const { openapi } = await import('./openapi.js');
      return openapi();
    }
    case 'exec': {
      const { execBinder } = await import('./exec.js');
      return execBinder(rest);
    }
    case undefined:
    case '--help':
    case '-h':
    case 'help':
      process.stdout.write(USAGE);
      return command === undefined ? 2 : 0;
    default:
      process.stderr.write(`dask-pmix: unknown command '${command}'\n${USAGE}`);
      return 2;
  }
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    process.stderr.write(`dask-pmix: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exitCode = 1;
  },
);
