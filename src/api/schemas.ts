// JSON Schemas for the REST API, derived from proto/dask_pmix.proto so that the model of record
// is the one place a field is defined. Request schemas refuse unknown fields and add the few
// constraints proto3 cannot say (required fields, lengths, ranges, limits). The .proto reaches
// the running sidecar as the descriptor generated at build time (src/proto), so an installed
// sidecar needs no source tree.
import protobuf from 'protobufjs';
import descriptor from '../proto/dask_pmix.descriptor.js';
import { REQUEST_LIMITS } from './limits.js';

export type JsonSchema = Record<string, unknown>;

let root: protobuf.Root | undefined;
function protoRoot(): protobuf.Root {
  root ??= protobuf.Root.fromJSON(descriptor);
  return root;
}

const INT_RANGES: Record<string, [number, number]> = {
  int32: [-(2 ** 31), 2 ** 31 - 1],
  sint32: [-(2 ** 31), 2 ** 31 - 1],
  sfixed32: [-(2 ** 31), 2 ** 31 - 1],
  uint32: [0, 2 ** 32 - 1],
  fixed32: [0, 2 ** 32 - 1],
  int64: [Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER],
  sint64: [Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER],
  uint64: [0, Number.MAX_SAFE_INTEGER],
  fixed64: [0, Number.MAX_SAFE_INTEGER],
};

function scalar(type: string): JsonSchema | undefined {
  if (type === 'string') return { type: 'string' };
  if (type === 'bool') return { type: 'boolean' };
  if (type === 'double' || type === 'float') return { type: 'number' };
  const r = INT_RANGES[type];
  if (r) return { type: 'integer', minimum: r[0], maximum: r[1] };
  if (type === 'bytes') return { type: 'string', contentEncoding: 'base64' };
  return undefined;
}

interface Options {
  /** Request schemas: unknown fields are refused and UNSPECIFIED enum values are not accepted. */
  request: boolean;
}

function fieldSchema(field: protobuf.Field, opts: Options): JsonSchema {
  field.resolve();
  let s: JsonSchema;
  const rt = field.resolvedType;
  if (rt instanceof protobuf.Enum) {
    const names = Object.keys(rt.values).filter((n) => !(opts.request && rt.values[n] === 0));
    s = { type: 'string', enum: names };
  } else if (rt instanceof protobuf.Type) {
    s = messageSchema(rt, opts);
  } else {
    s = scalar(field.type) ?? {};
  }
  if (field instanceof protobuf.MapField) return { type: 'object', additionalProperties: s };
  if (field.repeated) return { type: 'array', items: s };
  return s;
}

function messageSchema(type: protobuf.Type, opts: Options): JsonSchema {
  const properties: Record<string, JsonSchema> = {};
  for (const f of type.fieldsArray) {
    const s = fieldSchema(f, opts);
    if (f.comment) s.description = f.comment;
    properties[f.name] = s;
  }
  const out: JsonSchema = { type: 'object', properties, additionalProperties: false };
  if (type.comment) out.description = type.comment;
  return out;
}

/** The JSON Schema of `dask_pmix.v1.<name>`, with `refine` applied to its properties. */
export function schemaOf(
  name: string,
  opts: Options,
  refine: Record<string, JsonSchema> = {},
  required: string[] = [],
): JsonSchema {
  const type = protoRoot().lookupType(`dask_pmix.v1.${name}`);
  const s = messageSchema(type, opts);
  const props = s.properties as Record<string, JsonSchema>;
  for (const [k, extra] of Object.entries(refine)) {
    if (!props[k]) throw new Error(`${name} has no field ${k}`);
    props[k] = { ...props[k], ...extra };
  }
  if (required.length) s.required = required;
  return s;
}

const L = REQUEST_LIMITS;
const ID = { minLength: 1, maxLength: L.idLength };
/** A host name or address: a comma, space or other separator would break PMIx node lists and PMI maps. */
const HOST = { minLength: 1, maxLength: L.hostLength, pattern: '^[A-Za-z0-9._:%-]+$' };
const REQ = { request: true };
const RES = { request: false };

const ids = (max: number) => ({
  type: 'array',
  items: { type: 'string', ...ID },
  minItems: 1,
  maxItems: max,
  uniqueItems: true,
});
const tags = { maxItems: L.tags, items: { type: 'string', minLength: 1, maxLength: L.tagLength } };
const resources = { maxProperties: L.resources, propertyNames: { minLength: 1, maxLength: L.resourceKeyLength } };
const selectorRefine = {
  count: { minimum: 1, maximum: 100_000 },
  tags,
  resources,
  hosts: { maxItems: L.selectorHosts, items: { type: 'string', ...HOST } },
};
const selector = () => schemaOf('Selector', REQ, selectorRefine, ['count']);

/** Request body schemas. */
export const requests = {
  registerWorker: schemaOf(
    'RegisterWorkerRequest',
    REQ,
    {
      id: ID,
      address: { maxLength: L.idLength },
      host: HOST,
      // The worker reports the process its ranks run as; the PMIx server admits only that user.
      pid: { minimum: 1 },
      tags,
      resources,
    },
    ['id', 'host', 'pid', 'uid', 'gid'],
  ),
  definePset: (() => {
    const s = schemaOf('DefinePsetRequest', REQ, { name: { minLength: 1, maxLength: 128 }, members: ids(L.members) }, [
      'name',
    ]);
    (s.properties as Record<string, JsonSchema>).selector = selector();
    return s;
  })(),
  redefinePset: (() => {
    const s = schemaOf('DefinePsetRequest', REQ, { name: { minLength: 1, maxLength: 128 }, members: ids(L.members) });
    (s.properties as Record<string, JsonSchema>).selector = selector();
    return s;
  })(),
  createJob: (() => {
    const s = schemaOf(
      'CreateJobRequest',
      REQ,
      {
        pset: { maxLength: 128 },
        members: ids(L.members),
        wiringTimeoutSeconds: { minimum: 0, maximum: 86_400 },
        timeoutSeconds: { minimum: 0, maximum: 31_536_000 },
        poolJoinSeconds: { minimum: 0, maximum: 3600 },
        owner: { maxLength: 512 },
        labels: {
          maxProperties: L.labels,
          propertyNames: { minLength: 1, maxLength: L.labelKeyLength },
          additionalProperties: { type: 'string', maxLength: L.labelValueLength },
        },
      },
      ['impl'],
    );
    (s.properties as Record<string, JsonSchema>).selector = selector();
    return s;
  })(),
  reportMemberLost: schemaOf('ReportMemberLostRequest', REQ, { reason: { maxLength: 1024 } }),
  recordDrain: schemaOf('RecordDrainRequest', REQ, { reason: { maxLength: 1024 } }, ['state']),
  joinPool: schemaOf('JoinPoolRequest', REQ, { host: HOST, pid: { minimum: 0 } }),
  leavePool: schemaOf('LeavePoolRequest', REQ, { reason: { maxLength: 1024 } }),
  joinJob: schemaOf('JoinJobRequest', REQ, {
    waitSeconds: { minimum: 0, maximum: 60 },
    // At most one port per merge step: 32 steps would be 4 billion members.
    ports: {
      maxProperties: 32,
      propertyNames: { pattern: '^[0-9]{1,10}$' },
      additionalProperties: { type: 'string', minLength: 1, maxLength: 1024 },
    },
  }),
  leaveJob: schemaOf('LeaveJobRequest', REQ, { reason: { maxLength: 4096 }, failedRanks: { maxItems: 100_000 } }, [
    'ok',
  ]),
};

/** Response schemas (for the OpenAPI document and fast serialization). */
export const responses = {
  worker: schemaOf('Worker', RES),
  workerList: schemaOf('WorkerList', RES),
  pset: schemaOf('ProcessSet', RES),
  psetList: schemaOf('PsetList', RES),
  job: schemaOf('Job', RES),
  jobList: schemaOf('JobList', RES),
  elasticJob: schemaOf('ElasticJob', RES),
  elasticJobList: schemaOf('ElasticJobList', RES),
  drain: schemaOf('DrainRequest', RES),
  memberEnv: schemaOf('MemberEnv', RES),
  poolEnv: schemaOf('PoolEnv', RES),
  joinJob: schemaOf('JoinJobResponse', RES),
  health: schemaOf('Health', RES),
  error: schemaOf('ApiError', RES),
  event: schemaOf('Event', RES),
};
