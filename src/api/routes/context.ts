// What the route plugins share: the core, the auth checks, and small schema helpers.
import type { ResourceManager } from '../../rm/manager.js';
import type { Auth } from '../auth.js';
import { REQUEST_LIMITS } from '../limits.js';
import { type JsonSchema, responses } from '../schemas.js';

export interface RouteOptions {
  rm: ResourceManager;
  auth: Auth;
}

export const errors = (...codes: number[]) => Object.fromEntries(codes.map((c) => [c, responses.error]));

export const params = (...names: string[]): JsonSchema => ({
  type: 'object',
  properties: Object.fromEntries(
    names.map((n) => [n, { type: 'string', minLength: 1, maxLength: REQUEST_LIMITS.idLength }]),
  ),
  required: names,
});

export type Body<T> = { Body: T };
export type Params<T> = { Params: T };
