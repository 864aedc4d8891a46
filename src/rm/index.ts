// The resource-manager core: plain TypeScript, no I/O.
export * from './types.js';
export * from './errors.js';
export * from './clock.js';
export * from './events.js';
export * from './backend.js';
export * from './collectives.js';
export * from './name-service.js';
export * from './kv-store.js';
export * from './context-ids.js';
export * from './layout.js';
export { ResourceManager, type RmOptions } from './manager.js';
export type { LossDecision, Policy } from './policy.js';
export { Pool, type CohortOptions, type PoolBackend, type PoolCohort, type PoolEpochSpec, type PoolPlan, type PoolUser } from './pool.js';
export type { WorkerIdentity } from './manager.js';
export { Worlds, type WorldBackend } from './worlds.js';
export { acceptSteps, MAX_PORT_NAME } from './merge-tree.js';
