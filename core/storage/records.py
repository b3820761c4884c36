"""The row copies, re-exported from their home on the bottom floor (``core.values.records``)."""

from recap.core.values.records import ROLES as ROLES
from recap.core.values.records import ClearingRec as ClearingRec
from recap.core.values.records import Msg as Msg
from recap.core.values.records import SummaryRec as SummaryRec
