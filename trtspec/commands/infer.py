"""`trtspec infer`: one request to a running deployment, with its acceptance figures."""

from __future__ import annotations

import sys

import click
from rich.table import Table

from trtspec.client import Client, ClientError
from trtspec.commands._common import UserError, console, friendly_errors
from trtspec.contract import NUM_DRAFT_TOKENS, field_by_name
from trtspec.contract.models import BASELINE, ENSEMBLE
from trtspec.spec.metrics import SpecStats


@click.command("infer")
@click.argument("prompt")
@click.option("--url", default="localhost:8000", show_default=True,
              help="Server address (HTTP port for http, gRPC port for grpc).")
@click.option("--protocol", "-i", type=click.Choice(["http", "grpc"]), default="http", show_default=True)
@click.option("--baseline", is_flag=True, help="Use the target-only endpoint instead of the speculative one.")
@click.option("--model", default=None, help="Endpoint model name (default: ensemble, or baseline with --baseline).")
@click.option("--stream/--no-stream", default=False, show_default=True, help="Print tokens as they are accepted.")
@click.option("--max-tokens", "-n", type=click.IntRange(1), default=64, show_default=True)
@click.option("--draft-tokens", "-k", type=click.IntRange(0), default=None,
              help=f"{NUM_DRAFT_TOKENS} (default: the deployment's).")
@click.option("--draft-source", type=click.Choice(field_by_name("draft_source").choices), default=None,
              help="Who proposes tokens: the draft model, prompt lookup (ngram), or lookup first (hybrid).")
@click.option("--draft-length-policy", type=click.Choice(field_by_name("draft_length_policy").choices), default=None,
              help="fixed: always k draft tokens; adaptive: adapt k and skip draft sources that do not pay "
                   "(default: the deployment's).")
@click.option("--draft-logits", is_flag=True, default=None, help="Rejection sampling against the draft's logits.")
@click.option("--temperature", type=float, default=None, help="0 or unset: greedy.")
@click.option("--top-k", type=int, default=None)
@click.option("--top-p", type=float, default=None)
@click.option("--seed", type=int, default=None)
@click.option("--stop", "stop_words", multiple=True, help="Stop word (repeatable).")
@click.option("--chat", is_flag=True,
              help="Send PROMPT as a user message to the OpenAI chat endpoint of `trtspec serve` (--openai-url): "
                   "the server renders the deployed target's own chat template.")
@click.option("--openai-url", default="localhost:9000", show_default=True, help="The OpenAI API's address, for --chat.")
@friendly_errors(ClientError)
def command(prompt, url, protocol, baseline, model, stream, max_tokens, draft_tokens, draft_source, draft_length_policy,
            draft_logits,
            temperature, top_k, top_p, seed, stop_words, chat, openai_url) -> None:
    """Send PROMPT to a running trtspec deployment and print the completion and its acceptance figures.

    \b
    Examples:
      trtspec infer "The capital of France is" --stream
      trtspec infer "Summarise: ..." -k 4 --protocol grpc --url localhost:8001
      trtspec infer "Hello" --baseline            # target-only, for comparison
      trtspec infer "Write a haiku" --chat --stream   # chat template, via the OpenAI API
    """
    if chat:
        if protocol != "http" or url != "localhost:8000" or model:
            raise UserError("--chat goes through the OpenAI API: give its address with --openai-url "
                            "(--url, --protocol and --model are Triton's)")
        return _chat(openai_url, prompt, baseline, stream, max_tokens, {NUM_DRAFT_TOKENS: draft_tokens} | dict(
            draft_source=draft_source, draft_length_policy=draft_length_policy,
            use_draft_logits=draft_logits, top_k=top_k, return_token_ids=True,
        ), dict(temperature=temperature, top_p=top_p, seed=seed, stop=list(stop_words) or None))
    client = Client(url, protocol, model or (BASELINE if baseline else ENSEMBLE))
    params = {NUM_DRAFT_TOKENS: draft_tokens} | dict(
        draft_source=draft_source, draft_length_policy=draft_length_policy,
        use_draft_logits=draft_logits,
        temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop_words=list(stop_words) or None,
    )
    if stream:
        chunks = []
        for chunk in client.stream(prompt, max_tokens, stream=True, **params):
            chunks.append(chunk)
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
        sys.stdout.write("\n")
        stats = next((c.stats for c in reversed(chunks) if c.stats is not None), SpecStats())
        n_tokens = sum(len(c.token_ids) for c in chunks)
    else:
        g = client.generate(prompt, max_tokens, stream=False, **params)
        console.print(g.text, markup=False, highlight=False)
        stats, n_tokens = g.stats, len(g.token_ids)
    _print_stats(stats, n_tokens)


def _chat(url: str, prompt: str, baseline: bool, stream: bool, max_tokens: int, extra: dict, params: dict) -> None:
    """Why the OpenAI API and not a client-side template: the server has the deployed target's tokenizer and chat
    template; this client needs neither (nor transformers, nor the checkpoint)."""
    import openai

    base = url if "://" in url else f"http://{url}"
    client = openai.OpenAI(base_url=f"{base.rstrip('/')}/v1", api_key="unused", max_retries=0)
    try:
        want = BASELINE if baseline else ENSEMBLE
        models = [m.id for m in client.models.list().data if (m.model_extra or {}).get("triton_model") == want]
        if not models:
            raise ClientError(f"the OpenAI API at {url} serves no {want} model: is it `trtspec serve`?")
        request = dict(model=models[0], messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
                       extra_body={k: v for k, v in extra.items() if v is not None},
                       **{k: v for k, v in params.items() if v is not None})
        ids: list[int] = []
        stats = SpecStats()
        if stream:
            for c in client.chat.completions.create(**request, stream=True):
                if c.choices:
                    sys.stdout.write(c.choices[0].delta.content or "")
                    sys.stdout.flush()
                    ids += (c.choices[0].model_extra or {}).get("token_ids") or []
                speculative = (c.model_extra or {}).get("speculative")
                stats = SpecStats.from_wire(speculative) if speculative else stats
            sys.stdout.write("\n")
        else:
            r = client.chat.completions.create(**request)
            console.print(r.choices[0].message.content, markup=False, highlight=False)
            ids = (r.choices[0].model_extra or {}).get("token_ids") or []
            stats = SpecStats.from_wire((r.model_extra or {}).get("speculative") or {})
    except openai.APIConnectionError:
        raise ClientError(f"cannot reach the OpenAI API at {url} (`trtspec serve` serves it on port 9000)") from None
    except openai.APIError as e:
        raise ClientError(str(e)) from None
    _print_stats(stats, len(ids))


def _print_stats(stats: SpecStats, n_tokens: int) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_row("tokens", str(n_tokens))
    table.add_row("target calls", str(stats.num_iterations))
    if stats.total_draft_tokens:
        table.add_row("draft tokens accepted",
                      f"{stats.total_accepted_draft_tokens}/{stats.total_draft_tokens} ({stats.acceptance_rate:.0%})")
        per_pos = [f"{a / p:.2f}" if p else "-"
                   for a, p in zip(stats.accepted_per_position, stats.proposed_per_position)]
        table.add_row("acceptance by position", " ".join(per_pos))
        table.add_row("accepted by source", ", ".join(f"{s} {n}" for s, n in stats.by_source().items()))
    if stats.num_iterations:
        table.add_row("tokens per target call", f"{n_tokens / stats.num_iterations:.2f}")
    if stats.draft_fallbacks:
        table.add_row("draft fallbacks", str(stats.draft_fallbacks))
    if stats.load_paused_iterations:
        table.add_row("steps without a draft (load)", str(stats.load_paused_iterations))
    console.print(table)
