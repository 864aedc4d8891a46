// /v1/psets: named sets of workers, defined by members or a selector.
import type { FastifyPluginAsync } from 'fastify';
import { HttpError } from '../errors.js';
import { requests, responses } from '../schemas.js';
import { psetSpec, toJson } from '../wire.js';
import { type Body, errors, type Params, params, type RouteOptions } from './context.js';

type PsetBody = { name: string } & Parameters<typeof psetSpec>[1];

export const psetRoutes: FastifyPluginAsync<RouteOptions> = async (app, { rm, auth }) => {
  const write = { onRequest: auth.write };
  const read = { onRequest: auth.read };

  app.post<Body<PsetBody>>(
    '/psets',
    {
      ...write,
      schema: {
        security: auth.security.write,
        summary: 'Define a process set (explicit members or a selector)',
        tags: ['psets'],
        body: requests.definePset,
        response: { 201: responses.pset, ...errors(400, 401, 409, 422, 429) },
      },
    },
    async (req, reply) => reply.code(201).send(toJson.pset(rm.definePset(psetSpec(req.body.name, req.body)))),
  );

  app.get(
    '/psets',
    {
      ...read,
      schema: {
        security: auth.security.read,
        summary: 'List process sets',
        tags: ['psets'],
        response: { 200: responses.psetList, ...errors(401) },
      },
    },
    async () => ({ psets: rm.listPsets().map(toJson.pset) }),
  );

  app.get<Params<{ name: string }>>(
    '/psets/:name',
    {
      ...read,
      schema: {
        security: auth.security.read,
        summary: 'Get a process set',
        tags: ['psets'],
        params: params('name'),
        response: { 200: responses.pset, ...errors(401, 404) },
      },
    },
    async (req) => toJson.pset(rm.getPset(req.params.name)),
  );

  app.put<Params<{ name: string }> & Body<PsetBody>>(
    '/psets/:name',
    {
      ...write,
      schema: {
        security: auth.security.write,
        summary: 'Redefine a process set no active job uses',
        tags: ['psets'],
        params: params('name'),
        body: requests.redefinePset,
        response: { 200: responses.pset, ...errors(400, 401, 404, 409, 422) },
      },
    },
    async (req) => {
      if (req.body.name !== undefined && req.body.name !== req.params.name) {
        throw new HttpError(400, `the body names pset '${req.body.name}' but the path names '${req.params.name}'`);
      }
      return toJson.pset(rm.redefinePset(psetSpec(req.params.name, req.body)));
    },
  );

  app.delete<Params<{ name: string }>>(
    '/psets/:name',
    {
      ...write,
      schema: {
        security: auth.security.write,
        summary: 'Delete a process set no active job uses',
        tags: ['psets'],
        params: params('name'),
        response: { 200: responses.pset, ...errors(401, 404, 409) },
      },
    },
    async (req) => toJson.pset(rm.deletePset(req.params.name)),
  );
};
