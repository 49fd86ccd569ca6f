// Loaded into the official conformance suite (node --require): adds the sbx
// daemon's bearer token to its HTTP requests, since the suite has no option
// for credentials. Nothing else about its traffic changes.
const token = process.env.SBX_HTTP_TOKEN;
const orig = globalThis.fetch;
globalThis.fetch = (input, init = {}) => {
  const headers = new Headers(init.headers || (input instanceof Request ? input.headers : undefined));
  headers.set('Authorization', 'Bearer ' + token);
  return orig(input, { ...init, headers });
};
