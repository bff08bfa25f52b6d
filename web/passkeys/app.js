/*
 * The passkey sign-in page: password login, passkey registration, passkey login, and the list of the
 * account's passkeys (rename, deactivate, delete). Plain script, no build step; the WebAuthn calls go
 * through @simplewebauthn/browser (global SimpleWebAuthnBrowser, served beside this file).
 *
 * The session token is kept in this closure's memory only, never in localStorage, sessionStorage or a
 * cookie: no other script, tab or later visitor of the browser profile can read it from storage, and no
 * request carries it unless this code adds it (so no CSRF). A reload signs out; signing back in with a
 * passkey is one touch. User-supplied text (names) is only ever set as textContent or input values.
 */
'use strict';

(() => {
  const API = '/api/v1';
  const { startRegistration, startAuthentication, browserSupportsWebAuthn } = window.SimpleWebAuthnBrowser;
  /** { token, user } while signed in. */
  let session = null;

  const $ = (id) => document.getElementById(id);

  function status(text, kind = 'info') {
    const el = $('status');
    el.textContent = text;
    el.dataset.kind = kind;
  }

  class ApiError extends Error {
    constructor(status, body) {
      super((body && (body.detail || body.title)) || `HTTP ${status}`);
      this.status = status;
      this.code = body && body.code;
    }
  }

  async function call(method, path, body) {
    const headers = { accept: 'application/json' };
    if (body !== undefined) headers['content-type'] = 'application/json';
    if (session) headers.authorization = `Bearer ${session.token}`;
    const res = await fetch(API + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), credentials: 'omit', cache: 'no-store' });
    const data = res.status === 204 ? null : await res.json().catch(() => null);
    if (!res.ok) {
      // An expired or revoked session: back to the sign-in form.
      if (res.status === 401 && session && path !== '/auth/passkeys/login/complete') {
        session = null;
        render();
      }
      throw new ApiError(res.status, data);
    }
    return data;
  }

  /** WebAuthn errors from the browser (cancelled, timed out) and API problems, in one line. */
  function explain(err) {
    if (err && err.name === 'NotAllowedError') return 'the browser or authenticator cancelled or timed out.';
    return (err && err.message) || String(err);
  }

  function render() {
    $('signed-out').hidden = Boolean(session);
    $('signed-in').hidden = !session;
    if (session) $('who').textContent = session.user.username;
  }

  async function signedIn(body, how) {
    session = { token: body.session.token, user: body.user };
    // The token is checked once against /auth/me: the page shows what the API says it is.
    session.user = await call('GET', '/auth/me');
    render();
    await loadPasskeys();
    status(`Signed in as ${session.user.username} with ${how}.`, 'ok');
  }

  // ------------------------------------------------------------ sign in and out

  $('password-form').addEventListener('submit', async (event) => {
    event.preventDefault();
    status('Signing in…');
    try {
      const body = await call('POST', '/auth/login', { identifier: $('identifier').value.trim(), password: $('password').value });
      $('password').value = '';
      await signedIn(body, 'a password');
    } catch (err) {
      status(`Sign-in failed: ${explain(err)}`, 'error');
    }
  });

  $('passkey-login').addEventListener('click', async () => {
    status('Waiting for your passkey…');
    try {
      const username = $('identifier').value.trim();
      const begun = await call('POST', '/auth/passkeys/login/begin', username ? { username } : {});
      const credential = await startAuthentication({ optionsJSON: begun.options });
      const body = await call('POST', '/auth/passkeys/login/complete', { challenge_id: begun.challenge_id, credential });
      await signedIn(body, 'a passkey');
    } catch (err) {
      status(`Passkey sign-in failed: ${explain(err)}`, 'error');
    }
  });

  $('sign-out').addEventListener('click', async () => {
    // Ends the account's sessions on the server too, then forgets the token here.
    await call('POST', '/auth/logout').catch(() => undefined);
    session = null;
    $('passkeys').replaceChildren();
    render();
    status('Signed out.', 'ok');
  });

  // ------------------------------------------------------------ passkeys

  $('register-form').addEventListener('submit', async (event) => {
    event.preventDefault();
    status('Creating a passkey…');
    try {
      const begun = await call('POST', '/auth/passkeys/register/begin');
      const credential = await startRegistration({ optionsJSON: begun.options });
      const name = $('passkey-name').value.trim();
      const added = await call('POST', '/auth/passkeys/register/complete', { challenge_id: begun.challenge_id, credential, ...(name ? { name } : {}) });
      $('passkey-name').value = '';
      await loadPasskeys();
      status(`Passkey "${added.name}" added.`, 'ok');
    } catch (err) {
      status(`Adding a passkey failed: ${explain(err)}`, 'error');
    }
  });

  async function change(passkey, patch, done) {
    try {
      const updated = await call('PATCH', `/auth/passkeys/${encodeURIComponent(passkey.passkey_id)}`, patch);
      await loadPasskeys();
      status(done(updated), 'ok');
    } catch (err) {
      status(`Changing the passkey failed: ${explain(err)}`, 'error');
    }
  }

  function item(passkey) {
    const li = document.createElement('li');
    li.dataset.passkeyId = passkey.passkey_id;
    if (!passkey.active) li.classList.add('inactive');

    const title = document.createElement('strong');
    title.className = 'name';
    title.textContent = passkey.name;
    const meta = document.createElement('div');
    meta.className = 'meta';
    const used = passkey.last_used_at ? `last used ${new Date(passkey.last_used_at).toLocaleString()}` : 'never used';
    meta.textContent = `${passkey.active ? 'active' : 'inactive'} · ${passkey.device_type === 'multiDevice' ? 'synced' : 'this device only'} · added ${new Date(passkey.created_at).toLocaleString()} · ${used}`;

    const form = document.createElement('form');
    form.className = 'rename';
    const input = document.createElement('input');
    input.name = 'name';
    input.maxLength = 100;
    input.value = passkey.name;
    input.setAttribute('aria-label', 'New name');
    const save = document.createElement('button');
    save.type = 'submit';
    save.textContent = 'Rename';
    form.append(input, save);
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      change(passkey, { name: input.value.trim() }, (p) => `Renamed to "${p.name}".`);
    });

    const toggle = document.createElement('button');
    toggle.type = 'button';
    toggle.className = 'toggle';
    toggle.textContent = passkey.active ? 'Deactivate' : 'Activate';
    toggle.addEventListener('click', () => change(passkey, { active: !passkey.active }, (p) => `"${p.name}" is now ${p.active ? 'active' : 'inactive'}.`));

    const remove = document.createElement('button');
    remove.type = 'button';
    remove.className = 'delete';
    remove.textContent = 'Delete';
    remove.addEventListener('click', async () => {
      try {
        await call('DELETE', `/auth/passkeys/${encodeURIComponent(passkey.passkey_id)}`);
        await loadPasskeys();
        status(`Passkey "${passkey.name}" deleted.`, 'ok');
      } catch (err) {
        status(`Deleting the passkey failed: ${explain(err)}`, 'error');
      }
    });

    li.append(title, meta, form, toggle, remove);
    return li;
  }

  async function loadPasskeys() {
    const page = await call('GET', '/auth/passkeys/list?page_size=100');
    $('passkeys').replaceChildren(...page.items.map(item));
    $('no-passkeys').hidden = page.items.length > 0;
  }

  // ------------------------------------------------------------ start

  render();
  if (!browserSupportsWebAuthn()) {
    $('passkey-login').disabled = true;
    $('add-passkey').disabled = true;
    status('This browser does not support passkeys; password sign-in still works.', 'error');
  } else {
    status('Sign in with your password or a passkey.');
  }
})();
