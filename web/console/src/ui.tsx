import type { ComponentChildren } from 'preact';
import { useId, useLayoutEffect, useState } from 'preact/hooks';
import { ApiProblem } from './api';
import { useSession } from './session';

export interface Action {
  busy: boolean;
  /** The API's problem for the whole action (its detail), shown next to the button. */
  problem?: ApiProblem;
  /** Field errors of the last problem, by field name. */
  fields: Record<string, string>;
  /** The field names a control of this action shows the errors of (useFieldError); ProblemText lists the others. */
  claimed: Set<string>;
  notice?: string;
  setNotice(text: string | undefined): void;
  /** Runs fn; a problem it throws is kept for display (and a stale sign-in leads to re-sign-in). */
  run(fn: () => Promise<string | void>): Promise<void>;
}

export function useAction(): Action {
  const session = useSession();
  const [busy, setBusy] = useState(false);
  const [problem, setProblem] = useState<ApiProblem>();
  const [notice, setNotice] = useState<string>();
  const [claimed] = useState(() => new Set<string>());
  return {
    busy,
    problem,
    fields: problem?.fields() ?? {},
    claimed,
    notice,
    setNotice,
    async run(fn) {
      setBusy(true);
      setProblem(undefined);
      setNotice(undefined);
      try {
        const said = await fn();
        if (said) setNotice(said);
      } catch (err) {
        if (!(err instanceof ApiProblem)) throw err;
        if (err.code === 'reauthentication_required') session.reauthenticate();
        else if (err.status === 401 && session.user) void session.refresh();
        setProblem(err);
      } finally {
        setBusy(false);
      }
    },
  };
}

/** A field error's path names the request part alone when it is about the whole request (a refine, an empty body). */
const WHOLE_REQUEST = new Set(['body', 'query', 'params']);

/**
 * The problem's detail, with the wait a 429 asked for, and the field errors no control of the form shows
 * (a field the form has no input for, or a rule about the whole request): every message the API gave is on screen.
 */
export function ProblemText({ action, id }: { action: Action; id?: string }) {
  const p = action.problem;
  if (!p)
    return action.notice ? (
      <p class="notice" role="status">
        {action.notice}
      </p>
    ) : null;
  const wait = p.retryAfter ? ` Try again in ${p.retryAfter} second${p.retryAfter === 1 ? '' : 's'}.` : '';
  const rest = Object.entries(action.fields).filter(([name]) => !action.claimed.has(name));
  return (
    <div class="error" role="alert" id={id}>
      <p>
        {p.problem.detail}
        {wait}
      </p>
      {rest.length > 0 && (
        <ul class="field-errors">
          {rest.map(([name, message]) => (
            <li key={name}>{WHOLE_REQUEST.has(name) ? message : `${name.replaceAll('_', ' ')}: ${message}`}</li>
          ))}
        </ul>
      )}
    </div>
  );
}

/**
 * The API's error for one named field of an action, for any control (input, select, textarea): the
 * attributes that tie the control to its message (aria-invalid, aria-describedby, with the hint's id when
 * it has one) and the message to put under it. The field is claimed while mounted, so ProblemText does
 * not repeat it.
 */
export function useFieldError(action: Action | undefined, name: string, hintId?: string) {
  const id = useId();
  const claimed = action?.claimed;
  useLayoutEffect(() => {
    if (!claimed) return;
    claimed.add(name);
    return () => void claimed.delete(name);
  }, [claimed, name]);
  const error = action?.fields[name];
  const errorId = `${id}-error`;
  return {
    attrs: {
      'aria-invalid': error ? ('true' as const) : undefined,
      'aria-describedby': [error && errorId, hintId].filter(Boolean).join(' ') || undefined,
    },
    message: error ? (
      <span class="field-error" id={errorId}>
        {error}
      </span>
    ) : null,
  };
}

interface InputProps {
  type?: 'text' | 'email' | 'password' | 'number' | 'search' | 'url';
  autocomplete?: string;
  required?: boolean;
  minLength?: number;
  maxLength?: number;
  min?: number;
  max?: number;
  value?: string;
  /** The starting value of an uncontrolled field (re-renders keep what was typed). */
  defaultValue?: string;
  placeholder?: string;
  /** The id of a <datalist> of suggested values. */
  list?: string;
  onInput?: (e: Event & { currentTarget: HTMLInputElement }) => void;
}

/** A labelled input whose field error (from the API's problem) sits under it and is announced. */
export function Field(props: InputProps & { label: string; name: string; action?: Action; hint?: string }) {
  const { label, name, action, hint, ...input } = props;
  const id = useId();
  const hintId = hint ? `${id}-hint` : undefined;
  const error = useFieldError(action, name, hintId);
  return (
    <div class="field">
      <label for={id}>{label}</label>
      {/* Preact's input types discriminate on `type`; the field's own union is narrower than theirs. */}
      {/* eslint-disable-next-line @typescript-eslint/no-unnecessary-type-assertion -- picks one member of Preact's union of input attributes */}
      <input {...input} type={(input.type ?? 'text') as 'text'} id={id} name={name} {...error.attrs} />
      {hint && (
        <small class="muted" id={hintId}>
          {hint}
        </small>
      )}
      {error.message}
    </div>
  );
}

export function Submit({ action, children, class: cls }: { action: Action; children: ComponentChildren; class?: string }) {
  return (
    <button type="submit" disabled={action.busy} class={cls}>
      {children}
    </button>
  );
}

/** The named form field values of a submitted form. */
export function formValues(e: Event): Record<string, string> {
  e.preventDefault();
  const out: Record<string, string> = {};
  new FormData(e.currentTarget as HTMLFormElement).forEach((v, k) => {
    if (typeof v === 'string') out[k] = v;
  });
  return out;
}

export function CopyButton({ text, label }: { text: string; label: string }) {
  const [done, setDone] = useState(false);
  return (
    <button
      type="button"
      class="secondary"
      onClick={async () => {
        await navigator.clipboard.writeText(text);
        setDone(true);
      }}
    >
      {done ? 'Copied' : label}
    </button>
  );
}

export const when = (iso: string | null | undefined) => (iso ? new Date(iso).toLocaleString() : '—');

export function bytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n / 1024;
  let i = 0;
  for (; v >= 1024 && i < units.length - 1; i++) v /= 1024;
  return `${v.toFixed(1)} ${units[i]}`;
}

/**
 * Asks before an action that ends something or changes who has access: what it does, then what it ends
 * (sessions, access, links, a value that stops working). True when the person agreed.
 */
export function confirmEnd(what: string, ends: string): boolean {
  return window.confirm(`${what}\n\n${ends}`);
}

/** A problem the page found before asking the API, shown as the API's own are: under the field `name`. */
function fieldProblem(name: string, message: string): ApiProblem {
  return new ApiProblem(422, {
    type: 'about:blank',
    title: 'Invalid input',
    status: 422,
    code: 'validation_failed',
    detail: 'Nothing was changed: check the field marked below.',
    errors: [{ path: `body.${name}`, message }],
  });
}

/** A whole number typed into the field `name`, within bounds; anything else (text, a fraction, out of range) throws its fieldProblem. */
export function wholeNumber(name: string, typed: string, bounds: { min: number; max: number }): number {
  const n = /^\d{1,9}$/.test(typed.trim()) ? Number(typed.trim()) : NaN;
  if (!(n >= bounds.min && n <= bounds.max)) throw fieldProblem(name, `must be a whole number from ${bounds.min} to ${bounds.max}`);
  return n;
}
