"""Imports run one way: `import hf_mgk` registers the families and loads the models, never the publishing,
training or reproduction code (which import hf_mgk themselves)."""

import subprocess
import sys


def test_importing_the_package_loads_no_tooling():
    code = ("import sys, hf_mgk; tooling = sorted(m for m in sys.modules if m.split('.')[:2] in "
            "(['hf_mgk', 'hub'], ['hf_mgk', 'training'], ['hf_mgk', 'reproduce'], ['hf_mgk', 'bundled'])); "
            "print(tooling)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_publishing_modules_each_have_one_job():
    from hf_mgk import hub
    from hf_mgk.hub import card, export, remote_code, upload

    assert hub.model_card is card.model_card and hub.export_run is export.export_run
    assert hub.push_folder is upload.push_folder and hub.check_remote_code is remote_code.check_remote_code
    # the card is a function of the numbers: it reads no run folder and writes nothing (export does both)
    assert not {"shutil", "tempfile", "json"} & set(card.__dict__) and "read_run" not in card.__dict__
