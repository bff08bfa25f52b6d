import type { ComponentChildren } from 'preact';
import { useId, useState } from 'preact/hooks';
import { ApiProblem } from './api';
import { useSession } from './session';

export interface Action {
  busy: boolean;
  /** The API's problem for the whole action (its detail), shown next to the button. */
  problem?: ApiProblem;
  /** Field errors of the last problem, by field name. */
  fields: Record<string, string>;
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
  return {
    busy,
    problem,
    fields: problem?.fields() ?? {},
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

/** The problem's detail, with the wait a 429 asked for. */
export function ProblemText({ action, id }: { action: Action; id?: string }) {
  const p = action.problem;
  if (!p)
    return action.notice ? (
      <p class="notice" role="status">
        {action.notice}
      </p>
    ) : null;
  const wait = p.retryAfter ? ` Try again in ${p.retryAfter} second${p.retryAfter === 1 ? '' : 's'}.` : '';
  return (
    <p class="error" role="alert" id={id}>
      {p.problem.detail}
      {wait}
    </p>
  );
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
  const error = action?.fields[name];
  const id = useId();
  const described = [error && `${id}-error`, hint && `${id}-hint`].filter(Boolean).join(' ') || undefined;
  return (
    <div class="field">
      <label for={id}>{label}</label>
      {/* Preact's input types discriminate on `type`; the field's own union is narrower than theirs. */}
      {/* eslint-disable-next-line @typescript-eslint/no-unnecessary-type-assertion -- picks one member of Preact's union of input attributes */}
      <input {...input} type={(input.type ?? 'text') as 'text'} id={id} name={name} aria-invalid={error ? 'true' : undefined} aria-describedby={described} />
      {hint && (
        <small class="muted" id={`${id}-hint`}>
          {hint}
        </small>
      )}
      {error && (
        <span class="field-error" id={`${id}-error`}>
          {error}
        </span>
      )}
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
