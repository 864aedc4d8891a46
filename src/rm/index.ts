// The resource-manager core: plain TypeScript, no I/O.

export * from './backend.js';
export * from './clock.js';
export * from './collectives.js';
export * from './context-ids.js';
export * from './elastic-jobs.js';
export * from './errors.js';
export * from './events.js';
export * from './kv-store.js';
export * from './layout.js';
export type { WorkerIdentity } from './manager.js';
export { ResourceManager, type RmOptions } from './manager.js';
export { acceptSteps, MAX_PORT_NAME } from './merge-tree.js';
export * from './name-service.js';
export type { LossDecision, Policy } from './policy.js';
export {
  type CohortOptions,
  Pool,
  type PoolBackend,
  type PoolCohort,
  type PoolEpochSpec,
  type PoolPlan,
  type PoolUser,
} from './pool.js';
export * from './types.js';
export { type WorldBackend, Worlds } from './worlds.js';
