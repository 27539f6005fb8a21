"""The viewer and play pages in a real browser: headless Chromium (Debian's) driven by Playwright.

``NEMO_GYM_ENV_SCREENSHOTS=docs/images python -m pytest tests/viewer/test_browser.py`` writes
the README's screenshots there; otherwise they go to the test's temporary folder.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from nemo_gym_env.rollouts.output import RolloutWriter, failures_path
from nemo_gym_env.rollouts.report import metrics_table, summarize
from nemo_gym_env.viewer.summary import histogram
from tests.conftest import example_rows
from tests.viewer.conftest import running_cli, wait_until
from tests.viewer.rollout_data import HOSTILE, built_row, failure_row, jsonl

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1400, "height": 900}


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium package")
        pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    """A page that records script errors and requests; ``page.finish()`` (before the server stops, which
    the page would report as a failed poll) asserts that no script error happened and closes it."""
    context = browser.new_context(viewport=VIEWPORT)
    tab = context.new_page()
    tab.errors, tab.requests = [], []
    tab.on("pageerror", lambda error: tab.errors.append(str(error)))
    tab.on("console", lambda message: tab.errors.append(message.text) if message.type == "error" else None)
    tab.on("request", lambda request: tab.requests.append(request.url))

    def finish() -> None:
        errors = list(tab.errors)
        context.close()
        assert not errors, errors

    tab.finish = finish
    yield tab
    context.close()


@pytest.fixture
def screenshot(tmp_path):
    folder = Path(os.environ.get("NEMO_GYM_ENV_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)

    def take(tab, name: str, **kwargs) -> Path:
        path = folder / f"{name}.png"
        tab.screenshot(path=str(path), **kwargs)
        assert path.stat().st_size > 10_000
        return path

    return take


@pytest.fixture
def results(tmp_path, played_file):
    """A results folder as `rollouts` leaves it, with built rows (reasoning, tokens) added."""
    folder = tmp_path / "results"
    folder.mkdir()
    shutil.copy(played_file[0], folder / "rollouts.jsonl")
    shutil.copy(failures_path(played_file[0]), failures_path(folder / "rollouts.jsonl"))
    with open(folder / "rollouts.jsonl", "ab") as handle:
        handle.write(jsonl([built_row(30, r, float(r % 2), server="calculator", answer="42" if r % 2 else "48")
                            for r in range(4)]))
    return folder / "rollouts.jsonl"


def test_why_a_rollout_got_0_in_two_clicks_then_its_group(page, results, screenshot):
    from playwright.sync_api import expect

    with running_cli("view", "results/rollouts.jsonl", cwd=results.parent.parent) as viewer:
        page.goto(viewer.url + "/")
        rows = page.locator("#rollout-list tbody tr")
        expect(rows).to_have_count(12 + 4 + 3)
        expect(page.locator("#live")).to_contain_text("16 rollouts")
        screenshot(page, "viewer_list")

        page.select_option("#filter-outcome", "failed")                                   # click 1
        expect(rows).to_have_count(6 + 2 + 3)
        page.locator("#rollout-list tbody tr.failed", has_text="example_multi_step").first.click()  # click 2
        expect(page.locator("#rollout-title")).to_have_text("example_multi_step · task 0 · rollout 1")
        verdict = page.locator("section.verify")
        expect(verdict.locator(".reward")).to_have_text("0.0")
        # The reason is on the screen: the values submitted and the ones expected, in their order.
        expect(verdict).to_contain_text("order_instruction_following_failure")
        expect(verdict).to_contain_text("expected_synonym_values")
        expect(page.locator(".item.call")).to_have_count(4)
        expect(page.locator(".item.call").last).to_contain_text("extract_synonym_values")
        screenshot(page, "viewer_rollout")

        page.get_by_text("All rollouts of task 0 →").click()
        expect(page.locator("#group-title")).to_have_text("Task 0 · example_multi_step · 4 rollout(s)")
        columns = page.locator("#group .group-col")
        expect(columns).to_have_count(4)
        expect(columns.locator(".group-head .reward")).to_have_text(["1.0", "0.0", "1.0", "0.0"])
        expect(columns.first.locator("tr.differs").first).to_be_visible()
        screenshot(page, "viewer_group")

        page.go_back()
        expect(page.locator("#rollout-title")).to_be_visible()
        page.locator(".crumbs a").first.click()
        expect(page.locator("#filter-outcome")).to_have_value("failed")
        page.finish()


def test_filter_by_text_and_reward_sort_and_page(page, results):
    from playwright.sync_api import expect

    with open(results, "ab") as handle:  # enough rows for three pages
        handle.write(jsonl([built_row(100 + n, 0, (n % 5) / 4, server="calculator") for n in range(100)]))
    with running_cli("view", "results/rollouts.jsonl", cwd=results.parent.parent) as viewer:
        page.goto(viewer.url + "/")
        rows = page.locator("#rollout-list tbody tr")
        expect(rows).to_have_count(50)
        expect(page.locator("#list-counts")).to_contain_text("of 119 matching")
        page.click("#next-page")
        expect(page.locator("#list-counts")).to_contain_text("rows 51–100 of 119")
        page.click("#next-page")
        expect(rows).to_have_count(19)

        page.locator("th[data-column='reward']").click()
        expect(page.locator("th.sorted")).to_have_text("reward ▲")
        expect(rows.first.locator(".reward")).to_have_text("0.0")
        page.locator("th[data-column='reward']").click()
        expect(rows.first.locator(".reward")).to_have_text("1.0")

        page.fill("#filter-text", "PIZZA")  # the user message of task 0, any case
        page.fill("#filter-min", "0.5")
        page.click("#filters button[type=submit]")
        expect(page.locator("#list-counts")).to_contain_text("of 2 matching")
        expect(rows).to_have_count(2)
        page.select_option("#filter-server", "example_single_tool_call")
        expect(page.locator("#rollout-list + p")).to_have_text("No rollout matches these filters.")
        page.click("text=Clear")
        expect(page.locator("#list-counts")).to_contain_text("of 119 matching")
        page.finish()


def test_the_page_follows_a_file_being_written(page, tmp_path):
    from playwright.sync_api import expect

    with running_cli("view", "results/rollouts.jsonl", cwd=tmp_path) as viewer:
        page.goto(viewer.url + "/")
        expect(page.locator("#rollout-list + p")).to_contain_text("No rollouts yet")
        rows = page.locator("#rollout-list tbody tr")
        with RolloutWriter(tmp_path / "results" / "rollouts.jsonl") as writer:
            for rollout in range(3):
                writer.write(built_row(0, rollout, float(rollout % 2)))
                expect(rows).to_have_count(rollout + 1)
            writer.write(failure_row(1, 0, "built", "policy_error: the model answered garbage"))
            expect(rows).to_have_count(4)
            expect(page.locator("tr.failed-rollout")).to_contain_text("the model answered garbage")
        with open(tmp_path / "results" / "rollouts.jsonl", "ab") as handle:
            handle.write(b"{broken\n")
        expect(page.locator("#list-notice")).to_contain_text("1 line(s) are not rollout rows")
        page.click("#list-notice a")
        expect(page.locator("#error-list tbody tr")).to_have_count(1)
        expect(page.locator("#error-list")).to_contain_text("not JSON")
        page.finish()


@pytest.fixture(scope="module")
def mixed_results(tmp_path_factory):
    """A real ``rollouts`` run whose rows end every way a row can (failure kinds, no tool call, a game lost, ...)."""
    from tests.cli.conftest import mixed_run

    folder = tmp_path_factory.mktemp("mixed")
    return folder, mixed_run(folder).stdout


def test_the_summary_shows_the_numbers_rollouts_printed_for_the_same_file(page, mixed_results):
    """What ``rollouts`` printed and wrote to its metrics file is what the viewer's summary shows, opened
    with the command the run printed last: mean reward, masked samples, pass rates, what the model did."""
    import shlex

    from playwright.sync_api import expect

    from nemo_gym_env.protocol.outcomes import outcome_text

    folder, stdout = mixed_results
    printed = shlex.split(stdout.strip().splitlines()[-1].split(":", 1)[1])
    assert printed[:2] == ["nemo-gym-env", "view"]
    metrics = json.loads((folder / "results" / "rollouts_metrics.json").read_text())
    assert metrics["per_server"]["rewards"]["failure_kinds"] == {"wrong_answer": 4}
    with running_cli(*printed[1:], cwd=folder) as viewer:
        page.goto(viewer.url + "/#/summary")
        expect(page.locator("pre.metrics-table")).to_have_text(metrics_table(metrics))
        assert page.locator("pre.metrics-table").inner_text() in stdout  # the table the command printed
        for name, entry in [*metrics["per_server"].items(), ("total", metrics)]:
            card = page.locator(".card").filter(has=page.get_by_role("heading", name=name, exact=True))
            agent = entry["agent_metrics"]
            expect(card).to_contain_text(f"mean reward {agent['mean/reward']:.3f}")
            expect(card).to_contain_text(f"{entry['num_rollouts']} rollouts · {agent['num_tasks']} tasks · "
                                         f"{entry['num_failed']} failed · {entry['num_masked']} masked")
            expect(card).to_contain_text(f"pass@1 {agent['pass@1/reward']:.1f}%")
            expect(card.locator(".outcome")).to_have_text(
                [f"{outcome_text(kind)} {count}" for kind, count in entry["outcomes"].items()])
        rewards = page.locator(".card").filter(has=page.get_by_role("heading", name="rewards", exact=True))
        expect(rewards).to_contain_text("mean reward 0.333")
        expect(rewards.locator(".outcome")).to_have_text(["wrong_answer 4", "right 2"])
        page.finish()


def test_the_summary_page_shows_what_rollouts_prints(page, results, screenshot):
    from playwright.sync_api import expect

    with running_cli("view", "results/rollouts.jsonl", cwd=results.parent.parent) as viewer:
        page.goto(viewer.url + "/#/summary")
        expect(page.locator("pre.metrics-table")).to_have_text(metrics_table(summarize(results)))
        cards = page.locator(".card")
        expect(cards).to_have_count(4)  # three servers and the total
        expect(cards.first).to_contain_text("mean reward 0.500")
        # Bins labelled by what they hold: each reward value here (0.0 and 1.0), so a 1.0 reads 1.0.
        rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
        first = cards.first.locator("h3").inner_text()
        rewards = [r["reward"] for r in rows if r.get("agent_ref", {}).get("name", "all") == first]
        expect(cards.first.locator(".hist .edge")).to_have_text([b["label"] for b in histogram(rewards)])
        expect(cards.first.locator(".hist .edge").last).to_have_text("1.0")
        # Two sections, each named for what it lists; the failed rollout is in the first.
        failed = page.locator(".reasons-section").filter(has=page.get_by_role("heading", name="Failed rollouts, by reason"))
        expect(failed.locator("tbody tr")).to_have_count(1)
        expect(failed).to_contain_text("no answer within N s")
        expect(page.get_by_role("heading", name="The servers' verdicts, by reason")).to_have_count(1)
        # Nothing is cut off: every summary element fits its box (long cells wrap).
        clipped = page.evaluate("""() => [...document.querySelectorAll('.card, pre.metrics-table, table.reasons td')]
            .filter((e) => e.scrollWidth > e.clientWidth + 1).map((e) => e.textContent.slice(0, 80))""")
        assert clipped == [], clipped
        screenshot(page, "viewer_summary", full_page=True)
        assert all(url.startswith(viewer.url) or url.startswith("data:") for url in page.requests), page.requests
        page.finish()


def test_play_an_episode_to_reward_1_and_save_it(page, tmp_path, screenshot):
    from playwright.sync_api import expect

    task = example_rows("example_multi_step")[0]
    with running_cli("play", "example_multi_step", cwd=tmp_path) as play:
        page.goto(play.url + "/")
        page.select_option("#task-select", "0")
        page.click("#start")
        expect(page.locator("#episode-title")).to_have_text("Task 0 · example_multi_step")
        expect(page.locator(".item.role-user")).to_contain_text("pizza")
        calls = page.locator("#transcript .item.call")
        values = []
        for number, synonym in enumerate(task["expected_synonyms"]):
            page.fill("#tool-get_synonym_value textarea[name=synonym]", synonym)
            page.click("#tool-get_synonym_value .call-button")
            expect(calls).to_have_count(number + 1)
            values.append(json.loads(calls.nth(number).locator(".call-output pre").text_content())["synonym_value"])
        page.fill("#tool-extract_synonym_values textarea[name=synonym_values]", json.dumps(values))
        page.click("#tool-extract_synonym_values .call-button")
        expect(calls).to_have_count(len(values) + 1)
        expect(calls.last.locator(".call-output")).to_contain_text('"success": true')
        screenshot(page, "play")
        page.fill("#final-answer", "I looked up the three values and submitted them in glossary order.")
        page.click("#submit-answer")
        expect(page.locator("#result section.verify .reward")).to_have_text("1.0")
        expect(page.locator("#result")).to_contain_text("expected_synonym_values")
        page.click("#save")
        expect(page.locator("#saved")).to_have_text("saved to results/played.jsonl as task 0, rollout 0")
        saved = [json.loads(line) for line in (tmp_path / "results" / "played.jsonl").read_text().splitlines()]
        assert [(r["_ng_task_index"], r["_ng_rollout_index"], r["reward"]) for r in saved] == [(0, 0, 1.0)]

        session = next(url for url in page.requests if url.endswith("/save")).split("/")[-2]
        page.click("#new-episode")  # the episode left behind is closed on the server
        expect(page.locator("#task-select")).to_be_visible()
        wait_until(lambda: play.post(f"/api/sessions/{session}/step", {"message": "again"}).status_code == 404,
                   what="the left episode to be closed")
        page.finish()


def _assert_nothing_ran(page, dialogs):
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert dialogs == []
    assert page.locator("#main img, #main svg, #main iframe, #main script, #main object").count() == 0
    assert page.locator("a[href^='javascript' i]").count() == 0


@pytest.fixture
def hostile_page(browser):
    """A page with the Content-Security-Policy switched off: escaping alone must keep the data inert."""
    context = browser.new_context(viewport=VIEWPORT, bypass_csp=True)
    tab = context.new_page()
    tab.dialogs = []
    tab.on("dialog", lambda dialog: (tab.dialogs.append(dialog.message), dialog.dismiss()))
    yield tab
    context.close()


def test_hostile_rollouts_are_shown_as_text_and_never_run(hostile_page, tmp_path):
    from playwright.sync_api import expect

    page = hostile_page
    path = tmp_path / "rollouts.jsonl"
    hostile_row = built_row(0, 0, 0.0, server=HOSTILE[0], text=HOSTILE[1], tool_output=HOSTILE[2], answer=HOSTILE[3],
                            failure_reason=HOSTILE[1], **{HOSTILE[3]: HOSTILE[0], "expected_answer": HOSTILE[2]})
    hostile_row["responses_create_params"]["input"][0]["content"] = HOSTILE[2]
    path.write_bytes(jsonl([hostile_row, built_row(0, 1, 1.0, server=HOSTILE[0])]) + HOSTILE[0].encode() + b"\n")
    (tmp_path / "rollouts_failures.jsonl").write_bytes(jsonl([failure_row(1, 0, HOSTILE[1], HOSTILE[0])]))
    with running_cli("view", str(path), cwd=tmp_path) as viewer:
        for hash_ in ("#/list", "#/rollout/0/0", f"#/group/0/0?server={HOSTILE[0]}", "#/rollout/1/0", "#/summary",
                      "#/errors"):
            page.goto(viewer.url + "/" + hash_)
            expect(page.locator("#main")).not_to_contain_text("Loading")
            page.wait_for_load_state("networkidle")
            _assert_nothing_ran(page, page.dialogs)
            if hash_ == "#/rollout/0/0":
                for text in HOSTILE:
                    expect(page.locator("#main")).to_contain_text(text)
        page.goto(viewer.url + "/#/list")
        expect(page.locator("#rollout-list tbody tr").first).to_contain_text(HOSTILE[0])


def test_a_played_episode_full_of_markup_never_runs(hostile_page, tmp_path):
    from playwright.sync_api import expect

    page = hostile_page
    rows = example_rows("example_single_tool_call")[:1]
    rows[0]["responses_create_params"]["input"] = [{"role": "system", "content": HOSTILE[0]},
                                                   {"role": "user", "content": HOSTILE[1] + " " + HOSTILE[2]}]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(rows[0]) + "\n")
    with running_cli("play", "example_single_tool_call", "--input", str(tasks), cwd=tmp_path) as play:
        page.goto(play.url + "/")
        expect(page.locator("#task-select")).to_contain_text(HOSTILE[1])
        page.click("#start")
        expect(page.locator(".item.role-system")).to_contain_text(HOSTILE[0])
        page.fill("#tool-get_weather textarea[name=city]", HOSTILE[1] + HOSTILE[3])
        page.click("#tool-get_weather .call-button")
        expect(page.locator("#transcript .call-output")).to_contain_text("onerror")  # the server echoed it back
        page.fill("#final-answer", HOSTILE[2] + HOSTILE[0])
        page.click("#submit-answer")
        expect(page.locator("#result section.verify .reward")).to_have_text("1.0")
        expect(page.locator("#transcript .item.role-assistant")).to_contain_text(HOSTILE[0])
        page.wait_for_load_state("networkidle")
        _assert_nothing_ran(page, page.dialogs)


def test_a_conversation_shows_the_customers_turns_as_the_users(page, tmp_path, screenshot):
    """retail_support's rows (the real rollouts command): the simulated customer's messages are user turns
    between the agent's, and the verdict shows how the talk ended and the customer's last words."""
    from playwright.sync_api import expect

    from tests.cli.conftest import read_jsonl, run_cli

    out = tmp_path / "talks.jsonl"
    result = run_cli("rollouts", "retail_support", "--policy", "scripted", "--limit", "2", "-o", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    row = next(r for r in read_jsonl(out) if r["_ng_task_index"] == 0)
    heard = [item["content"] for item in row["response"]["output"] if item.get("role") == "user"]
    with running_cli("view", out.name, cwd=tmp_path) as viewer:
        page.goto(viewer.url + "/")
        expect(page.locator("#rollout-list tbody tr")).to_have_count(2)
        page.locator("#rollout-list tbody tr", has_text="retail_support").first.click()
        expect(page.locator("#rollout-title")).to_have_text("retail_support · task 0 · rollout 0")
        said = page.locator(".item.message.role-user")
        # The opening request (the prompt's last user message), then each answer of the customer.
        expect(said.locator(".label").first).to_have_text("user")
        for text in heard:
            expect(said.filter(has_text=text)).to_have_count(1)
        expect(page.locator(".item.message.role-assistant")).to_have_count(len(heard) + 1)
        expect(page.locator("section.verify")).to_contain_text(row["info"]["user_said_last"])
        screenshot(page, "viewer_conversation")
        page.finish()
