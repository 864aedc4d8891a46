// Writes src/proto/dask_pmix.descriptor.js: the .proto's reflection descriptor (with its comments,
// which become the OpenAPI descriptions) as a module, so that an installed sidecar derives its
// JSON Schemas without the source tree.
import { writeFileSync } from 'node:fs';
import protobuf from 'protobufjs';

const [src, out] = process.argv.slice(2);
const root = new protobuf.Root().loadSync(src, { alternateCommentMode: true });
// Empty comments are left out (null would not survive as a description).
const json = JSON.stringify(
  root.toJSON({ keepComments: true }),
  (k, v) => (k === 'comment' && v == null ? undefined : v),
  1,
);
writeFileSync(out, `// Generated from ${src} by scripts/proto-descriptor.mjs; do not edit.\nexport default ${json};\n`);
writeFileSync(
  out.replace(/\.js$/, '.d.ts'),
  `declare const descriptor: import('protobufjs').INamespace;\nexport default descriptor;\n`,
);
