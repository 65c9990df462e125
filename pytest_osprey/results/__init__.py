"""Saved results: the records, campaign.json and preflight.json formats, and the results-folder
reader. Below judgement and reports; knows nothing of engines or of how a campaign measures."""

from .campaign_file import CAMPAIGN_SCHEMA, CampaignFile, CampaignFileError, ConditionRun
from .folder import SavedCampaign, iter_pairs, load_campaign
from .preflight_file import Preflight, read_preflight
from .records import Measurement, RecordsError, RecordWriter, RequestRecord, read_records

__all__ = [
    "CAMPAIGN_SCHEMA",
    "CampaignFile",
    "CampaignFileError",
    "ConditionRun",
    "Measurement",
    "Preflight",
    "RecordWriter",
    "RecordsError",
    "RequestRecord",
    "SavedCampaign",
    "iter_pairs",
    "load_campaign",
    "read_preflight",
    "read_records",
]
